// A gpu::Backend decorator for benchmarks: forwards every call to a wrapped
// backend and adds the wall time of each call to one of a few buckets, so a
// benchmark can split a model step into attention, indexer scoring, the
// rest of the backend's work and the host code between calls.
//
// Attribution is by call, plus the calls that feed one: the key gathers
// (GatherRows / CopyColumns) issued right before an attention call belong
// to attention, those right before IndexScores and the CopyToHost right
// after it (the scores coming back) to indexer scoring, as are SelectTopK
// and SelectCandidateBlocks (the choice made where the scores are). That is
// how model/layers/attention.cc issues them (ChunkAttention,
// ChunkIndexScores, SelectOnBackend);
// a gather followed by anything else counts as other backend work.
//
// On the CPU backend every call is synchronous, so the buckets are the time
// of the work itself; a queueing (GPU) backend would need Synchronize()
// around each call for this to mean anything.
//
// Thread-compatible, like any Backend: one caller at a time.

#ifndef MNEME_TESTS_BENCH_WORKER_TIMING_BACKEND_H_
#define MNEME_TESTS_BENCH_WORKER_TIMING_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"

namespace mneme::bench {

// Cumulative counters of a TimingBackend. Times in seconds.
struct BackendTimes {
  // Attention / SparseAttention / ChooseAndAttend calls and the key gathers
  // right before them.
  double attention_s = 0;
  double attention_gather_s = 0;
  // IndexScores calls, the key gathers right before them, the score
  // copies to the host right after and the SelectTopK /
  // SelectCandidateBlocks calls.
  double index_scores_s = 0;
  double index_gather_s = 0;
  double index_copy_s = 0;
  double index_select_s = 0;
  // Every other call (projections, MoE, norms, cache writes, sampling...).
  double other_s = 0;
  // Counts: attention calls and the keys their queries attended (per query
  // and head group: the non-negative entries of SparseAttention's idx, the
  // range lengths of Attention's); IndexScores calls and the query x key
  // pairs they scored.
  int64_t attention_calls = 0;
  int64_t attended_keys = 0;
  // Every call made through the backend (what a GPU pays a launch or a
  // copy for).
  int64_t calls = 0;
  // The same calls by Backend operation (its method's name).
  std::map<std::string, int64_t> calls_by_op;
  // The calls whose results the host waits for (on a GPU, the points where
  // the host stops queueing work and the device drains its queue):
  // CopyToHost, Synchronize, SelectTopK, SelectCandidateBlocks, MoeRoute,
  // Sample, LogProbs.
  int64_t host_waits = 0;
  int64_t index_calls = 0;
  int64_t index_pairs = 0;

  double attention_total_s() const { return attention_s + attention_gather_s; }
  double index_total_s() const {
    return index_scores_s + index_gather_s + index_copy_s + index_select_s;
  }
  double backend_total_s() const {
    return attention_total_s() + index_total_s() + other_s;
  }
};

class TimingBackend : public gpu::Backend {
 public:
  // `inner` is borrowed and must outlive this object.
  explicit TimingBackend(gpu::Backend& inner) : inner_(inner) {}

  // The counters since construction or the last Reset(). A gather still
  // waiting for the call that follows it is not in them yet.
  const BackendTimes& times() const { return times_; }
  void Reset();

  std::string name() const override;
  absl::StatusOr<std::unique_ptr<gpu::Buffer>> Allocate(
      int64_t elements) override;
  void CopyFromHost(absl::Span<const float> src, float* dst) override;
  void CopyToHost(const float* src, absl::Span<float> dst) override;
  absl::Status Synchronize() override;
  absl::StatusOr<std::unique_ptr<gpu::Weight>> UploadWeight(
      const gpu::HostWeight& weight) override;
  void DequantizeWeight(const gpu::Weight& weight,
                        absl::Span<float> out) override {
    inner_.DequantizeWeight(weight, out);
  }
  void Linear(gpu::ConstMatrixView x, const gpu::Weight& w, gpu::MatrixView y,
              Accumulate accumulate) override;
  void RmsNorm(gpu::ConstMatrixView x, const float* weight, float eps,
               gpu::MatrixView y) override;
  void Rope(gpu::MatrixView x, int head_dim, int rope_dim,
            absl::Span<const double> inv_freq,
            absl::Span<const int32_t> positions,
            RopeDirection direction) override;
  void Add(gpu::ConstMatrixView a, gpu::ConstMatrixView b,
           gpu::MatrixView y) override;
  void CopyColumns(gpu::ConstMatrixView x, int64_t src_col,
                   gpu::MatrixView y) override;
  void PlaceColumns(gpu::ConstMatrixView x, gpu::MatrixView y,
                    int64_t dst_col) override;
  void GatherRows(gpu::ConstMatrixView x, absl::Span<const int32_t> rows,
                  gpu::MatrixView y) override;
  void GatherColumns(gpu::ConstMatrixView x, absl::Span<const int32_t> cols,
                     gpu::MatrixView y) override;
  void ScatterRows(gpu::ConstMatrixView src, absl::Span<const int32_t> rows,
                   gpu::MatrixView x) override;
  void Embedding(absl::Span<const int32_t> ids, int64_t first_id,
                 const gpu::Weight& table, gpu::MatrixView y) override;
  void ApplySink(gpu::ConstMatrixView lse, const float* sink,
                 gpu::MatrixView out) override;
  void WeighDcpParts(gpu::ConstMatrixView lses, gpu::ConstMatrixView part,
                     int rank, int64_t heads, gpu::MatrixView send,
                     gpu::MatrixView global_own) override;
  void SparseAttention(gpu::ConstMatrixView q, gpu::ConstMatrixView kv,
                       int heads, absl::Span<const int32_t> idx, int width,
                       float scale, const float* sink, gpu::MatrixView out,
                       gpu::MatrixView lse) override;
  void IndexScores(gpu::ConstMatrixView q, gpu::ConstMatrixView w,
                   gpu::ConstMatrixView keys, absl::Span<const int32_t> rows,
                   gpu::MatrixView out) override;
  void SelectTopK(gpu::ConstMatrixView scores, float scale,
                  absl::Span<const int64_t> visible, int k,
                  absl::Span<const int32_t> candidate_blocks,
                  int blocks_per_row, int block_size, absl::Span<int32_t> ids,
                  absl::Span<int32_t> counts) override;
  void ChooseAndAttend(gpu::ConstMatrixView scores, float index_scale,
                       absl::Span<const int64_t> visible, int k,
                       absl::Span<const int32_t> entry_rows,
                       gpu::ConstMatrixView q, gpu::ConstMatrixView kv,
                       int heads, absl::Span<const int32_t> fixed,
                       int fixed_width, float scale, const float* sink,
                       gpu::MatrixView out, gpu::MatrixView lse) override;
  void SelectCandidateBlocks(gpu::ConstMatrixView scores, float scale,
                             absl::Span<const int64_t> visible, int topk_blocks,
                             int block_size, absl::Span<int32_t> blocks,
                             absl::Span<int32_t> counts) override;
  void SoftmaxPool(gpu::ConstMatrixView kv, gpu::ConstMatrixView score,
                   gpu::ConstMatrixView ape, gpu::MatrixView out) override;
  void HcPost(gpu::ConstMatrixView a, gpu::ConstMatrixView post,
              gpu::ConstMatrixView comb, int hc,
              gpu::MatrixView x_stream) override;
  void HcHead(gpu::ConstMatrixView x_stream, const gpu::Weight& fn,
              const float* base, const float* scale, int hc, float eps,
              gpu::MatrixView x) override;
  void HcMix(gpu::ConstMatrixView x_stream, const gpu::Weight& fn,
             const float* base, const float* scale, int hc, int sinkhorn_iters,
             float hc_eps, float norm_eps, gpu::MatrixView pre,
             gpu::MatrixView post, gpu::MatrixView comb) override;
  void HcCollapse(gpu::ConstMatrixView x_stream, gpu::ConstMatrixView pre,
                  int hc, gpu::MatrixView x) override;
  void EngramGate(gpu::ConstMatrixView kv, const float* q_w, const float* k_w,
                  int hc, float eps, gpu::MatrixView x_stream) override;
  void UnpackBf16Rows(const float* packed, int64_t block_floats,
                      absl::Span<const int32_t> columns, int64_t cols_per_block,
                      int row_dim, gpu::MatrixView y) override;
  absl::StatusOr<std::unique_ptr<gpu::HostStaging>> AllocateHostStaging(
      int64_t floats) override {
    return inner_.AllocateHostStaging(floats);
  }
  bool ReadsStagingInPlace(const gpu::HostStaging& staging) const override {
    return inner_.ReadsStagingInPlace(staging);
  }
  bool ReadsAllocatedStagingInPlace() const override {
    return inner_.ReadsAllocatedStagingInPlace();
  }
  const float* StageFromHost(gpu::HostStaging& staging, int64_t offset,
                             int64_t floats, float* dst) override;
  void AwaitStaged() override;
  void MoeRoute(gpu::ConstMatrixView logits, const float* bias, int top_k,
                float routed_scaling, absl::Span<int32_t> expert_ids,
                absl::Span<float> weights) override;
  void ExpertForward(gpu::ConstMatrixView x_all, absl::Span<const int32_t> rows,
                     absl::Span<const float> weights, const gpu::Weight& w1,
                     const gpu::Weight& w2, const gpu::Weight& w3, float limit,
                     gpu::MatrixView y_all) override;
  void MoeExperts(gpu::ConstMatrixView x_all,
                  absl::Span<const int32_t> expert_ids,
                  absl::Span<const float> weights, int top_k,
                  int64_t first_expert,
                  absl::Span<const gpu::ExpertRef> experts, float limit,
                  gpu::MatrixView y_all) override;
  void MoeLayer(gpu::ConstMatrixView x_all, gpu::ConstMatrixView logits,
                const gpu::MoeRouting& routing, int64_t first_expert,
                absl::Span<const gpu::ExpertRef> experts, float limit,
                gpu::MatrixView y_all) override;
  void Sample(gpu::ConstMatrixView logits,
              absl::Span<const gpu::SamplingParams> params,
              absl::Span<int32_t> ids, absl::Span<float> logprobs) override;
  void LogProbs(gpu::ConstMatrixView logits, absl::Span<const int32_t> ids,
                absl::Span<float> logprobs) override;

 private:
  using Clock = std::chrono::steady_clock;
  enum class Kind {
    kOther,
    kGather,
    kAttention,
    kIndexScores,
    kCopyToHost,
    kSelectTopK
  };

  // Times `fn` and books it as a call of `kind` to operation `op` (the
  // Backend method's name).
  template <typename Fn>
  void Timed(const char* op, Kind kind, Fn&& fn);
  void Book(Kind kind, double seconds);

  gpu::Backend& inner_;
  BackendTimes times_;
  // Gathers waiting for the call that tells what they fed.
  double pending_gather_s_ = 0;
  // Whether the previous call was IndexScores (its scores go to the host).
  bool after_index_scores_ = false;
};

}  // namespace mneme::bench

#endif  // MNEME_TESTS_BENCH_WORKER_TIMING_BACKEND_H_
