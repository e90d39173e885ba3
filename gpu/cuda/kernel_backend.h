#ifndef MNEME_GPU_CUDA_KERNEL_BACKEND_H_
#define MNEME_GPU_CUDA_KERNEL_BACKEND_H_

// The CUDA backend's Backend implementation over an Executor: weights kept
// in their checkpoint formats (fp32, bf16, FP8 with UE8M0 block scales,
// MXFP4, NVFP4, EXL3 trellises, GridBook superblocks) and decoded inside the
// kernels. Every op is a kernel of kernel_ops.h. Routing, sampling (greedy
// and drawn), log-probs and the indexer's top-k reduce on the device and
// bring back only their results; MoeLayer keeps a layer's expert
// assignments on the device altogether.
//
// Thread-safety: as Backend (one caller at a time).

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gpu/cuda/executor.h"
#include "gpu/sampling.h"

namespace mneme::gpu {

namespace kernels {
struct LinearGroup;
struct TopKRows;
}  // namespace kernels

class KernelBackend final : public Backend {
 public:
  struct Options {
    // Sample draws rows at a temperature this many bytes of token weights
    // (doubles, vocabulary-wide) at a time, in whole rows (at least one).
    int64_t sample_weight_bytes = int64_t{64} << 20;
    // MoeLayer keeps each set of experts' group tables on the device (about
    // 1 KiB an expert), the most recently used up to this many bytes (at
    // least one set). It should hold every MoE layer's set: the layers are
    // visited in a cycle, so a budget short of them misses on every call.
    // The default holds 58 layers of 256 experts four times over.
    int64_t expert_table_bytes = int64_t{64} << 20;
  };
  explicit KernelBackend(std::unique_ptr<Executor> executor)
      : KernelBackend(std::move(executor), Options()) {}
  KernelBackend(std::unique_ptr<Executor> executor, Options options);
  ~KernelBackend() override;
  KernelBackend(const KernelBackend&) = delete;
  KernelBackend& operator=(const KernelBackend&) = delete;

  std::string name() const override { return executor_->name(); }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t elements) override;
  void CopyFromHost(absl::Span<const float> src, float* dst) override;
  void CopyToHost(const float* src, absl::Span<float> dst) override;
  absl::Status Synchronize() override;
  absl::StatusOr<std::unique_ptr<HostStaging>> AllocateHostStaging(
      int64_t floats) override;
  const float* StageFromHost(HostStaging& staging, int64_t offset,
                             int64_t floats, float* dst) override;
  // Pinned staging where the device reads pinned memory in place (GB10).
  bool ReadsStagingInPlace(const HostStaging& staging) const override;
  bool ReadsAllocatedStagingInPlace() const override;
  void AwaitStaged() override;
  absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(
      const HostWeight& weight) override;
  void DequantizeWeight(const Weight& weight, absl::Span<float> out) override;

  void Linear(ConstMatrixView x, const Weight& w, MatrixView y,
              Accumulate accumulate) override;
  void RmsNorm(ConstMatrixView x, const float* weight, float eps,
               MatrixView y) override;
  void Rope(MatrixView x, int head_dim, int rope_dim,
            absl::Span<const double> inv_freq,
            absl::Span<const int32_t> positions,
            RopeDirection direction) override;
  void Add(ConstMatrixView a, ConstMatrixView b, MatrixView y) override;
  void CopyColumns(ConstMatrixView x, int64_t src_col, MatrixView y) override;
  void PlaceColumns(ConstMatrixView x, MatrixView y, int64_t dst_col) override;
  void GatherRows(ConstMatrixView x, absl::Span<const int32_t> rows,
                  MatrixView y) override;
  void GatherColumns(ConstMatrixView x, absl::Span<const int32_t> cols,
                     MatrixView y) override;
  void ScatterRows(ConstMatrixView src, absl::Span<const int32_t> rows,
                   MatrixView x) override;
  void Embedding(absl::Span<const int32_t> ids, int64_t first_id,
                 const Weight& table, MatrixView y) override;
  void ApplySink(ConstMatrixView lse, const float* sink,
                 MatrixView out) override;
  void WeighDcpParts(ConstMatrixView lses, ConstMatrixView part, int rank,
                     int64_t heads, MatrixView send,
                     MatrixView global_own) override;
  void SparseAttention(ConstMatrixView q, ConstMatrixView kv, int heads,
                       absl::Span<const int32_t> idx, int width, float scale,
                       const float* sink, MatrixView out,
                       MatrixView lse) override;
  void IndexScores(ConstMatrixView q, ConstMatrixView w, ConstMatrixView keys,
                   absl::Span<const int32_t> rows, MatrixView out) override;
  void SelectTopK(ConstMatrixView scores, float scale,
                  absl::Span<const int64_t> visible, int k,
                  absl::Span<const int32_t> candidate_blocks,
                  int blocks_per_row, int block_size, absl::Span<int32_t> ids,
                  absl::Span<int32_t> counts) override;
  void ChooseAndAttend(ConstMatrixView scores, float index_scale,
                       absl::Span<const int64_t> visible, int k,
                       absl::Span<const int32_t> entry_rows, ConstMatrixView q,
                       ConstMatrixView kv, int heads,
                       absl::Span<const int32_t> fixed, int fixed_width,
                       float scale, const float* sink, MatrixView out,
                       MatrixView lse) override;
  void SelectCandidateBlocks(ConstMatrixView scores, float scale,
                             absl::Span<const int64_t> visible, int topk_blocks,
                             int block_size, absl::Span<int32_t> blocks,
                             absl::Span<int32_t> counts) override;
  void SoftmaxPool(ConstMatrixView kv, ConstMatrixView score,
                   ConstMatrixView ape, MatrixView out) override;
  void HcPost(ConstMatrixView a, ConstMatrixView post, ConstMatrixView comb,
              int hc, MatrixView x_stream) override;
  void HcHead(ConstMatrixView x_stream, const Weight& fn, const float* base,
              const float* scale, int hc, float eps, MatrixView x) override;
  void HcMix(ConstMatrixView x_stream, const Weight& fn, const float* base,
             const float* scale, int hc, int sinkhorn_iters, float hc_eps,
             float norm_eps, MatrixView pre, MatrixView post,
             MatrixView comb) override;
  void HcCollapse(ConstMatrixView x_stream, ConstMatrixView pre, int hc,
                  MatrixView x) override;
  void EngramGate(ConstMatrixView kv, const float* q_w, const float* k_w,
                  int hc, float eps, MatrixView x_stream) override;
  void UnpackBf16Rows(const float* packed, int64_t block_floats,
                      absl::Span<const int32_t> columns, int64_t cols_per_block,
                      int row_dim, MatrixView y) override;
  void MoeRoute(ConstMatrixView logits, const float* bias, int top_k,
                float routed_scaling, absl::Span<int32_t> expert_ids,
                absl::Span<float> weights) override;
  void ExpertForward(ConstMatrixView x_all, absl::Span<const int32_t> rows,
                     absl::Span<const float> weights, const Weight& w1,
                     const Weight& w2, const Weight& w3, float limit,
                     MatrixView y_all) override;
  void MoeExperts(ConstMatrixView x_all, absl::Span<const int32_t> expert_ids,
                  absl::Span<const float> weights, int top_k,
                  int64_t first_expert, absl::Span<const ExpertRef> experts,
                  float limit, MatrixView y_all) override;
  void MoeLayer(ConstMatrixView x_all, ConstMatrixView logits,
                const MoeRouting& routing, int64_t first_expert,
                absl::Span<const ExpertRef> experts, float limit,
                MatrixView y_all) override;
  void Sample(ConstMatrixView logits, absl::Span<const SamplingParams> params,
              absl::Span<int32_t> ids, absl::Span<float> logprobs) override;
  void LogProbs(ConstMatrixView logits, absl::Span<const int32_t> ids,
                absl::Span<float> logprobs) override;

 private:
  // A device block reused by later calls: grown (never shrunk) on demand.
  struct Arena {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  // Carves an op's temporaries from an arena of at least `bytes`.
  class Carver;

  uint8_t* Reserve(Arena& arena, int64_t bytes);
  // y[T, w.rows] (+)= x[T, w.cols] . w^T on device memory.
  void Gemm(const float* x, int64_t tokens, const Weight& w, float* y,
            bool accumulate);
  // The row op or the tiles (by the tokens and rows) of one weight's view.
  void RunLinear(const kernels::LinearOp& op);
  // MoeRoute's routing on the device: expert_ids and weights [T * top_k]
  // (device) from logits; temporaries (RouteBytes) from `carve`.
  static int64_t RouteBytes(int64_t tokens, int64_t experts);
  void RouteByScore(Carver& carve, ConstMatrixView logits, const float* bias,
                    int top_k, float routed_scaling, int32_t* expert_ids,
                    float* weights);
  // The routed experts' Gemm in at most three launches: expert e's tokens
  // are rows [offsets[e], offsets[e + 1]) of x [n, cols] and y [n, rows],
  // y = x . w^T with w = experts[e].*which, each expert as Gemm would (row
  // op or tiles by the same rule, the static W4A4 contract by a grouped
  // quantization). Temporaries from `carve`: GroupedGemmBytes.
  void GroupedGemm(Carver& carve, absl::Span<const int64_t> offsets,
                   absl::Span<const ExpertRef> experts,
                   const Weight* ExpertRef::*which, const float* x, float* y);
  static int64_t GroupedGemmBytes(int64_t experts, int64_t n, int64_t cols);
  // One projection's weights, as PlannedGemm needs them: every expert's
  // shape, and whether any takes the static W4A4 contract.
  struct WeightShape {
    int64_t rows = 0;
    int64_t cols = 0;
    bool w4a4 = false;
  };
  // MoeLayer's group tables of one set of experts on the device: every
  // expert's weight view and input scale in both halves of the three
  // projections' tables (kernels::ExpertPlanOp writes each call's tokens into
  // them), kept by the weights' upload serials, most recently used first.
  struct ExpertTables {
    std::vector<uint64_t> serials;
    void* device = nullptr;
    int64_t bytes = 0;
    std::array<WeightShape, kernels::kExpertTables> shapes{};
  };
  // The kept tables of `experts`, made (and the least recently used beyond
  // Options::expert_table_bytes dropped) on a miss.
  const ExpertTables& TablesOf(absl::Span<const ExpertRef> experts);
  // GroupedGemm over a table kernels::ExpertPlanOp laid out on the device
  // (the experts' offsets there too), in launches sized for all n slots, no
  // expert having more than most_tokens of them (a hint for the launch);
  // temporaries from `carve`: PlannedGemmBytes.
  void PlannedGemm(Carver& carve, const kernels::LinearGroup* table,
                   int64_t experts, const int64_t* offsets, int64_t n,
                   int64_t most_tokens, const WeightShape& shape,
                   const float* x, float* y);
  static int64_t PlannedGemmBytes(int64_t n, int64_t cols);
  // ExpertForward and MoeExperts: the assignments grouped on the host
  // (their rows of x_all and weights; expert e's are [offsets[e],
  // offsets[e + 1])), run by RunExperts with GroupedGemm.
  void GroupedOnHost(ConstMatrixView x_all, absl::Span<const int32_t> rows,
                     absl::Span<const float> weights,
                     absl::Span<const int64_t> offsets,
                     absl::Span<const ExpertRef> experts, float limit,
                     MatrixView y_all);
  // The SwiGLU experts over n grouped slots: slot i is row rows[i] of x_all
  // (negative: padding, skipped) with weight weights[i] (device);
  // project(j, x, y) runs projection j (0: w1, 1: w3, 2: w2) of every
  // expert over its slots. Temporaries from `carve`: ExpertSlotsBytes.
  void RunExperts(Carver& carve, ConstMatrixView x_all, const int32_t* rows,
                  const float* weights, int64_t n, int64_t inter,
                  absl::FunctionRef<void(int, const float*, float*)> project,
                  float limit, MatrixView y_all);
  static int64_t ExpertSlotsBytes(int64_t n, int64_t d, int64_t inter);
  // Sample's draws for rows at a temperature (kernels::SampleRow, host
  // parameters in, each row's drawn token out).
  void DrawRows(ConstMatrixView logits, absl::Span<kernels::SampleRow> drawn);
  // `n` floats of device memory copied back to the host.
  std::vector<float> Fetch(const float* src, int64_t n);
  // `bytes` of device memory into host `dst`, after the queued work; stops
  // the process when the device failed (see CopyToHost).
  void FetchBytes(void* dst, const void* src, int64_t bytes);
  // Per row t of logits, reduced on the device: argmax[t] (the lowest index
  // of the largest value, as std::max_element), max[t] (that value) and
  // logprob[t] = log_softmax(row)[ids[t]] (ids empty: at argmax[t]), and
  // when lse is not empty lse[t], the row's log-sum-exp (logprob = x - lse
  // in double). Only these come back to the host.
  void RowStats(ConstMatrixView logits, absl::Span<const int32_t> ids,
                absl::Span<int32_t> argmax, absl::Span<float> max,
                absl::Span<float> logprob, absl::Span<double> lse = {});
  // Bytes of ChooseTopK's temporaries for `tokens` rows of `cols` entries.
  static int64_t TopKBytes(int64_t tokens, int64_t cols, int k);
  // The radix select of SelectTopK over `rows` (device; cols >= 1), its
  // temporaries carved from `carve`: returns the device ids [tokens, k],
  // followed by the counts [tokens].
  int32_t* ChooseTopK(Carver& carve, const kernels::TopKRows& rows,
                      int64_t tokens, int k);
  // ChooseTopK, the ids and counts brought back to the host.
  void RunTopK(Carver& carve, const kernels::TopKRows& rows, int64_t tokens,
               int k, absl::Span<int32_t> ids, absl::Span<int32_t> counts);
  // Bytes of Attend's temporaries for `tokens` queries of `heads` heads of
  // hd over lists of `width` keys.
  static int64_t AttendBytes(int64_t tokens, int64_t heads, int64_t width,
                             int64_t hd);
  // SparseAttention over the key lists idx (device, [q.rows, width]).
  void Attend(Carver& carve, ConstMatrixView q, ConstMatrixView kv, int heads,
              const int32_t* idx, int64_t width, float scale, const float* sink,
              MatrixView out, MatrixView lse);

  std::unique_ptr<Executor> executor_;
  Options options_;
  // Temporaries of one op (staged host indices, intermediate products).
  Arena work_;
  // Quantized activations of the W4A4 contract (used inside Gemm, so apart
  // from work_).
  Arena w4a4_;
  // EXL3 products' transformed activations and outputs (Gemm).
  Arena exl3_;
  // Sample's host scratch.
  std::vector<int32_t> argmax_;
  std::vector<float> max_;
  std::vector<double> lse_;
  // RowStats' and SelectTopK's host copies of what they bring back.
  std::vector<int32_t> fetched_;
  // ScatterRows' host scratch, kept to spare an allocation a call.
  std::vector<int32_t> scatter_from_;
  std::vector<int32_t> scatter_to_;
  absl::flat_hash_set<int32_t> scatter_seen_;
  // MoeLayer's kept tables (TablesOf) and their bytes.
  std::list<ExpertTables> expert_tables_;
  int64_t expert_table_bytes_ = 0;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_KERNEL_BACKEND_H_
