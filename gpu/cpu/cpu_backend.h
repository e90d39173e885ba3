#ifndef MNEME_GPU_CPU_CPU_BACKEND_H_
#define MNEME_GPU_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gpu/cpu/fork_join_pool.h"

namespace mneme::gpu {

namespace cpu_backend_internal {
class CpuWeight;
}  // namespace cpu_backend_internal

// The most threads CpuBackendOptions.threads may ask for.
inline constexpr int kMaxCpuBackendThreads = 1024;

struct CpuBackendOptions {
  // Threads that work on one call, the calling thread included: the
  // backend's own loops (over tokens, heads, rows) and OpenBLAS's sgemm.
  // 0 = std::thread::hardware_concurrency() (1 where that is unknown); at
  // most kMaxCpuBackendThreads. Default: 0.
  int threads = 0;
  // Keep every weight as fp32 (4 bytes per parameter, every product through
  // OpenBLAS) instead of in its checkpoint format: the yardstick of the
  // quantized kernels in tests and benchmarks. Default: false.
  bool dequantize_weights = false;
};

// Backend (gpu/backend.h) on the host, the reference implementation and the
// backend of machines without a GPU.
//
// Memory: buffers are zero-filled host arrays aligned to 64 bytes. Weights
// stay in their checkpoint format (bf16 / FP8 block / MXFP4 / NVFP4 codes and
// scales, copied as they are), so a loaded model holds its weight bytes and
// no more; Weight::bytes() reports them. Products with up to 16 tokens
// (decode) run on the packed weights (quant_kernels.h: for one token each
// row is decoded into registers and multiplied there; for 2 to 16, a tile at
// a time into L1, each weight byte read once for all of them); with more
// tokens (prefill), panels of 4 MiB are decoded to fp32 and multiplied by
// OpenBLAS's sgemm. The decoded values are exactly those of
// gpu/host_weight.h's DequantizeHostWeight, so results differ from an fp32
// copy of the weights by the order of the fp32 sums (and where each side
// fuses multiply-adds) only. fp32 weights, and
// every weight with CpuBackendOptions.dequantize_weights, are fp32 arrays
// multiplied by OpenBLAS (sgemv for a single token).
//
// Compute: elementwise loops and dot products (RmsNorm, attention scores,
// hyper-connections, the Engram gate) are Highway SIMD, dispatched at run
// time to the best target of the CPU; loops over tokens, heads and rows are
// split over a fixed pool of `threads` threads started by Create (the caller
// plus threads - 1 workers; none is started per call), small loops staying
// on the calling thread. The pool and OpenBLAS never run at the same time.
//
// OpenBLAS keeps one thread count for the whole process: Create sets it to
// `threads` (openblas_set_num_threads), so with several CPU backends in one
// process the last one created decides it.
//
// Numerics beyond backend.h:
//  - UploadWeight also returns DataLoss for NaN weight values (an fp32 or
//    bf16 NaN, an e4m3 NaN code of kFp8Block) and for a NaN kNvfp4
//    global_scale; an infinite global_scale is InvalidArgument.
//  - Attention attends each visible key once: overlapping ranges are merged.
//  - MoeRoute: when the chosen experts' scores all underflow to 0 (logits
//    below about -100), each gets routed_scaling / top_k.
//  - Sample: a temperature that is not > 0 (also NaN) is greedy. A sampled
//    draw takes the tokens kept by top_k, then top_p (of the distribution
//    renormalised over the top_k survivors), then min_p, in order of
//    descending probability (ties: lower id first) - or in id order when
//    none of top_k / top_p is active - and picks the first whose cumulative
//    probability exceeds u * (kept mass), with u = (splitmix64(seed) >> 11)
//    * 2^-53 (the first output of SplitMix64 seeded with params.seed). The
//    same logits, params and seed give the same token on every machine and
//    with every thread count.
//
// Thread-safety: as Backend, one caller at a time; weights are immutable and
// may be read from any thread. The backend owns its pool; weights and
// buffers it returns are owned by the caller and must not outlive it.
class CpuBackend : public Backend {
 public:
  // InvalidArgument naming the field for invalid options.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      const CpuBackendOptions& options);

  ~CpuBackend() override = default;

  // Threads per call (options.threads resolved).
  int threads() const { return pool_.threads(); }
  // The Highway target of the SIMD loops, e.g. "AVX2".
  static const char* SimdTargetName();

  std::string name() const override { return "cpu"; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(int64_t elements) override;
  void CopyFromHost(absl::Span<const float> src, float* dst) override;
  void CopyToHost(const float* src, absl::Span<float> dst) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  // Backend memory is host memory: the ops read the staging in place.
  const float* StageFromHost(HostStaging& staging, int64_t offset,
                             int64_t floats, float* dst) override;
  bool ReadsStagingInPlace(const HostStaging& /*staging*/) const override {
    return true;
  }
  bool ReadsAllocatedStagingInPlace() const override { return true; }

  void DequantizeWeight(const Weight& weight, absl::Span<float> out) override;
  absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(
      const HostWeight& weight) override;

  void Linear(ConstMatrixView x, const Weight& w, MatrixView y,
              Accumulate accumulate) override;
  void RmsNorm(ConstMatrixView x, const float* weight, float eps,
               MatrixView y) override;
  void Rope(MatrixView x, int head_dim, int rope_dim,
            absl::Span<const double> inv_freq,
            absl::Span<const int32_t> positions,
            RopeDirection direction) override;
  void Add(ConstMatrixView a, ConstMatrixView b, MatrixView y) override;
  void PlaceColumns(ConstMatrixView x, MatrixView y, int64_t dst_col) override;
  void CopyColumns(ConstMatrixView x, int64_t src_col, MatrixView y) override;
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

  void HcMix(ConstMatrixView x_stream, const Weight& fn, const float* base,
             const float* scale, int hc, int sinkhorn_iters, float hc_eps,
             float norm_eps, MatrixView pre, MatrixView post,
             MatrixView comb) override;
  void HcCollapse(ConstMatrixView x_stream, ConstMatrixView pre, int hc,
                  MatrixView x) override;
  void HcPost(ConstMatrixView a, ConstMatrixView post, ConstMatrixView comb,
              int hc, MatrixView x_stream) override;
  void HcHead(ConstMatrixView x_stream, const Weight& fn, const float* base,
              const float* scale, int hc, float eps, MatrixView x) override;

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
  CpuBackend(int threads, bool dequantize_weights)
      : pool_(threads), dequantize_weights_(dequantize_weights) {}

  // x [T, K] . w^T -> y [T, N] (w: N x K); y = or +=.
  void Gemm(const float* x, int64_t tokens,
            const cpu_backend_internal::CpuWeight& w, float* y,
            Accumulate accumulate);

  ForkJoinPool pool_;
  // CpuBackendOptions.dequantize_weights.
  const bool dequantize_weights_;
  // Gemm's decoded weight panel (prefill on packed weights): at most
  // kPanelFloats, or one row of the widest weight (EXL3: one 128-row block).
  std::vector<float> panel_;
  // Gemm's transformed input of an EXL3 product (at most 16 tokens x twice
  // the widest EXL3 weight's input features: the tiles' row order).
  std::vector<float> exl3_input_;
  // Gemm's W4A4-quantized input (GridBook NVFP4 rungs with the static
  // contract): tokens x input features.
  std::vector<float> w4a4_input_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CPU_CPU_BACKEND_H_
