#include "tests/bench/worker/timing_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace mneme::bench {

template <typename Fn>
void TimingBackend::Timed(const char* op, Kind kind, Fn&& fn) {
  ++times_.calls;
  ++times_.calls_by_op[op];
  const Clock::time_point t0 = Clock::now();
  std::forward<Fn>(fn)();
  Book(kind, std::chrono::duration<double>(Clock::now() - t0).count());
}

void TimingBackend::Book(Kind kind, double seconds) {
  if (kind == Kind::kGather) {
    pending_gather_s_ += seconds;
    return;
  }
  // The gathers before this call fed it.
  switch (kind) {
    case Kind::kAttention:
      times_.attention_gather_s += pending_gather_s_;
      times_.attention_s += seconds;
      break;
    case Kind::kIndexScores:
      times_.index_gather_s += pending_gather_s_;
      times_.index_scores_s += seconds;
      break;
    case Kind::kCopyToHost:
      times_.other_s += pending_gather_s_;
      if (after_index_scores_) {
        times_.index_copy_s += seconds;
      } else {
        times_.other_s += seconds;
      }
      break;
    case Kind::kSelectTopK:
      times_.other_s += pending_gather_s_;
      times_.index_select_s += seconds;
      break;
    case Kind::kOther:
    case Kind::kGather:
      times_.other_s += pending_gather_s_ + seconds;
      break;
  }
  pending_gather_s_ = 0;
  after_index_scores_ = kind == Kind::kIndexScores;
}

void TimingBackend::Reset() {
  times_ = BackendTimes{};
  pending_gather_s_ = 0;
  after_index_scores_ = false;
}

std::string TimingBackend::name() const { return inner_.name(); }

absl::StatusOr<std::unique_ptr<gpu::Buffer>> TimingBackend::Allocate(
    int64_t elements) {
  absl::StatusOr<std::unique_ptr<gpu::Buffer>> buffer;
  Timed(__func__, Kind::kOther, [&] { buffer = inner_.Allocate(elements); });
  return buffer;
}

void TimingBackend::CopyFromHost(absl::Span<const float> src, float* dst) {
  Timed(__func__, Kind::kOther, [&] { inner_.CopyFromHost(src, dst); });
}

void TimingBackend::CopyToHost(const float* src, absl::Span<float> dst) {
  ++times_.host_waits;
  Timed(__func__, Kind::kCopyToHost, [&] { inner_.CopyToHost(src, dst); });
}

absl::Status TimingBackend::Synchronize() {
  ++times_.host_waits;
  absl::Status status;
  Timed(__func__, Kind::kOther, [&] { status = inner_.Synchronize(); });
  return status;
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> TimingBackend::UploadWeight(
    const gpu::HostWeight& weight) {
  absl::StatusOr<std::unique_ptr<gpu::Weight>> w;
  Timed(__func__, Kind::kOther, [&] { w = inner_.UploadWeight(weight); });
  return w;
}

void TimingBackend::Linear(gpu::ConstMatrixView x, const gpu::Weight& w,
                           gpu::MatrixView y, Accumulate accumulate) {
  Timed(__func__, Kind::kOther, [&] { inner_.Linear(x, w, y, accumulate); });
}

void TimingBackend::RmsNorm(gpu::ConstMatrixView x, const float* weight,
                            float eps, gpu::MatrixView y) {
  Timed(__func__, Kind::kOther, [&] { inner_.RmsNorm(x, weight, eps, y); });
}

void TimingBackend::Rope(gpu::MatrixView x, int head_dim, int rope_dim,
                         absl::Span<const double> inv_freq,
                         absl::Span<const int32_t> positions,
                         RopeDirection direction) {
  Timed(__func__, Kind::kOther, [&] {
    inner_.Rope(x, head_dim, rope_dim, inv_freq, positions, direction);
  });
}

void TimingBackend::Add(gpu::ConstMatrixView a, gpu::ConstMatrixView b,
                        gpu::MatrixView y) {
  Timed(__func__, Kind::kOther, [&] { inner_.Add(a, b, y); });
}

void TimingBackend::CopyColumns(gpu::ConstMatrixView x, int64_t src_col,
                                gpu::MatrixView y) {
  Timed(__func__, Kind::kGather, [&] { inner_.CopyColumns(x, src_col, y); });
}

void TimingBackend::PlaceColumns(gpu::ConstMatrixView x, gpu::MatrixView y,
                                 int64_t dst_col) {
  Timed(__func__, Kind::kOther, [&] { inner_.PlaceColumns(x, y, dst_col); });
}

void TimingBackend::GatherRows(gpu::ConstMatrixView x,
                               absl::Span<const int32_t> rows,
                               gpu::MatrixView y) {
  Timed(__func__, Kind::kGather, [&] { inner_.GatherRows(x, rows, y); });
}

void TimingBackend::GatherColumns(gpu::ConstMatrixView x,
                                  absl::Span<const int32_t> cols,
                                  gpu::MatrixView y) {
  Timed(__func__, Kind::kGather, [&] { inner_.GatherColumns(x, cols, y); });
}

void TimingBackend::ScatterRows(gpu::ConstMatrixView src,
                                absl::Span<const int32_t> rows,
                                gpu::MatrixView x) {
  Timed(__func__, Kind::kOther, [&] { inner_.ScatterRows(src, rows, x); });
}

void TimingBackend::Embedding(absl::Span<const int32_t> ids, int64_t first_id,
                              const gpu::Weight& table, gpu::MatrixView y) {
  Timed(__func__, Kind::kOther,
        [&] { inner_.Embedding(ids, first_id, table, y); });
}

void TimingBackend::ApplySink(gpu::ConstMatrixView lse, const float* sink,
                              gpu::MatrixView out) {
  Timed(__func__, Kind::kAttention, [&] { inner_.ApplySink(lse, sink, out); });
}

void TimingBackend::WeighDcpParts(gpu::ConstMatrixView lses,
                                  gpu::ConstMatrixView part, int rank,
                                  int64_t heads, gpu::MatrixView send,
                                  gpu::MatrixView global_own) {
  Timed(__func__, Kind::kAttention, [&] {
    inner_.WeighDcpParts(lses, part, rank, heads, send, global_own);
  });
}

void TimingBackend::SparseAttention(gpu::ConstMatrixView q,
                                    gpu::ConstMatrixView kv, int heads,
                                    absl::Span<const int32_t> idx, int width,
                                    float scale, const float* sink,
                                    gpu::MatrixView out, gpu::MatrixView lse) {
  Timed(__func__, Kind::kAttention, [&] {
    inner_.SparseAttention(q, kv, heads, idx, width, scale, sink, out, lse);
  });
  ++times_.attention_calls;
  for (const int32_t i : idx) times_.attended_keys += i >= 0 ? 1 : 0;
}

void TimingBackend::IndexScores(gpu::ConstMatrixView q, gpu::ConstMatrixView w,
                                gpu::ConstMatrixView keys,
                                absl::Span<const int32_t> rows,
                                gpu::MatrixView out) {
  Timed(__func__, Kind::kIndexScores,
        [&] { inner_.IndexScores(q, w, keys, rows, out); });
  ++times_.index_calls;
  // The pairs with a key (rows shared by every query, or each its own).
  int64_t keyed = 0;
  for (const int32_t r : rows) keyed += r >= 0 ? 1 : 0;
  times_.index_pairs +=
      static_cast<int64_t>(rows.size()) == out.cols ? q.rows * keyed : keyed;
}

void TimingBackend::SelectTopK(gpu::ConstMatrixView scores, float scale,
                               absl::Span<const int64_t> visible, int k,
                               absl::Span<const int32_t> candidate_blocks,
                               int blocks_per_row, int block_size,
                               absl::Span<int32_t> ids,
                               absl::Span<int32_t> counts) {
  ++times_.host_waits;
  Timed(__func__, Kind::kSelectTopK, [&] {
    inner_.SelectTopK(scores, scale, visible, k, candidate_blocks,
                      blocks_per_row, block_size, ids, counts);
  });
}

void TimingBackend::ChooseAndAttend(
    gpu::ConstMatrixView scores, float index_scale,
    absl::Span<const int64_t> visible, int k,
    absl::Span<const int32_t> entry_rows, gpu::ConstMatrixView q,
    gpu::ConstMatrixView kv, int heads, absl::Span<const int32_t> fixed,
    int fixed_width, float scale, const float* sink, gpu::MatrixView out,
    gpu::MatrixView lse) {
  Timed(__func__, Kind::kAttention, [&] {
    inner_.ChooseAndAttend(scores, index_scale, visible, k, entry_rows, q, kv,
                           heads, fixed, fixed_width, scale, sink, out, lse);
  });
  ++times_.attention_calls;
  for (const int32_t i : fixed) times_.attended_keys += i >= 0 ? 1 : 0;
  // The chosen entries never come back: a row chooses min(k, visible) of
  // them, counted as attended (exact where this rank holds every entry, as
  // without DCP).
  for (const int64_t v : visible) {
    times_.attended_keys += std::min<int64_t>(k, std::min(v, scores.cols));
  }
}

void TimingBackend::SelectCandidateBlocks(gpu::ConstMatrixView scores,
                                          float scale,
                                          absl::Span<const int64_t> visible,
                                          int topk_blocks, int block_size,
                                          absl::Span<int32_t> blocks,
                                          absl::Span<int32_t> counts) {
  ++times_.host_waits;
  Timed(__func__, Kind::kSelectTopK, [&] {
    inner_.SelectCandidateBlocks(scores, scale, visible, topk_blocks,
                                 block_size, blocks, counts);
  });
}

void TimingBackend::SoftmaxPool(gpu::ConstMatrixView kv,
                                gpu::ConstMatrixView score,
                                gpu::ConstMatrixView ape, gpu::MatrixView out) {
  Timed(__func__, Kind::kOther,
        [&] { inner_.SoftmaxPool(kv, score, ape, out); });
}

void TimingBackend::HcPost(gpu::ConstMatrixView a, gpu::ConstMatrixView post,
                           gpu::ConstMatrixView comb, int hc,
                           gpu::MatrixView x_stream) {
  Timed(__func__, Kind::kOther,
        [&] { inner_.HcPost(a, post, comb, hc, x_stream); });
}

void TimingBackend::HcHead(gpu::ConstMatrixView x_stream, const gpu::Weight& fn,
                           const float* base, const float* scale, int hc,
                           float eps, gpu::MatrixView x) {
  Timed(__func__, Kind::kOther,
        [&] { inner_.HcHead(x_stream, fn, base, scale, hc, eps, x); });
}

void TimingBackend::HcMix(gpu::ConstMatrixView x_stream, const gpu::Weight& fn,
                          const float* base, const float* scale, int hc,
                          int sinkhorn_iters, float hc_eps, float norm_eps,
                          gpu::MatrixView pre, gpu::MatrixView post,
                          gpu::MatrixView comb) {
  Timed(__func__, Kind::kOther, [&] {
    inner_.HcMix(x_stream, fn, base, scale, hc, sinkhorn_iters, hc_eps,
                 norm_eps, pre, post, comb);
  });
}

void TimingBackend::HcCollapse(gpu::ConstMatrixView x_stream,
                               gpu::ConstMatrixView pre, int hc,
                               gpu::MatrixView x) {
  Timed(__func__, Kind::kOther,
        [&] { inner_.HcCollapse(x_stream, pre, hc, x); });
}

void TimingBackend::EngramGate(gpu::ConstMatrixView kv, const float* q_w,
                               const float* k_w, int hc, float eps,
                               gpu::MatrixView x_stream) {
  Timed(__func__, Kind::kOther,
        [&] { inner_.EngramGate(kv, q_w, k_w, hc, eps, x_stream); });
}

void TimingBackend::UnpackBf16Rows(const float* packed, int64_t block_floats,
                                   absl::Span<const int32_t> columns,
                                   int64_t cols_per_block, int row_dim,
                                   gpu::MatrixView y) {
  Timed(__func__, Kind::kOther, [&] {
    inner_.UnpackBf16Rows(packed, block_floats, columns, cols_per_block,
                          row_dim, y);
  });
}

const float* TimingBackend::StageFromHost(gpu::HostStaging& staging,
                                          int64_t offset, int64_t floats,
                                          float* dst) {
  const float* at = nullptr;
  Timed(__func__, Kind::kOther,
        [&] { at = inner_.StageFromHost(staging, offset, floats, dst); });
  return at;
}

void TimingBackend::AwaitStaged() {
  Timed(__func__, Kind::kOther, [&] { inner_.AwaitStaged(); });
}

void TimingBackend::MoeRoute(gpu::ConstMatrixView logits, const float* bias,
                             int top_k, float routed_scaling,
                             absl::Span<int32_t> expert_ids,
                             absl::Span<float> weights) {
  ++times_.host_waits;
  Timed(__func__, Kind::kOther, [&] {
    inner_.MoeRoute(logits, bias, top_k, routed_scaling, expert_ids, weights);
  });
}

void TimingBackend::ExpertForward(gpu::ConstMatrixView x_all,
                                  absl::Span<const int32_t> rows,
                                  absl::Span<const float> weights,
                                  const gpu::Weight& w1, const gpu::Weight& w2,
                                  const gpu::Weight& w3, float limit,
                                  gpu::MatrixView y_all) {
  Timed(__func__, Kind::kOther, [&] {
    inner_.ExpertForward(x_all, rows, weights, w1, w2, w3, limit, y_all);
  });
}

void TimingBackend::MoeExperts(gpu::ConstMatrixView x_all,
                               absl::Span<const int32_t> expert_ids,
                               absl::Span<const float> weights, int top_k,
                               int64_t first_expert,
                               absl::Span<const gpu::ExpertRef> experts,
                               float limit, gpu::MatrixView y_all) {
  Timed(__func__, Kind::kOther, [&] {
    inner_.MoeExperts(x_all, expert_ids, weights, top_k, first_expert, experts,
                      limit, y_all);
  });
}

void TimingBackend::MoeLayer(gpu::ConstMatrixView x_all,
                             gpu::ConstMatrixView logits,
                             const gpu::MoeRouting& routing,
                             int64_t first_expert,
                             absl::Span<const gpu::ExpertRef> experts,
                             float limit, gpu::MatrixView y_all) {
  Timed(__func__, Kind::kOther, [&] {
    inner_.MoeLayer(x_all, logits, routing, first_expert, experts, limit,
                    y_all);
  });
}

void TimingBackend::Sample(gpu::ConstMatrixView logits,
                           absl::Span<const gpu::SamplingParams> params,
                           absl::Span<int32_t> ids,
                           absl::Span<float> logprobs) {
  ++times_.host_waits;
  Timed(__func__, Kind::kOther,
        [&] { inner_.Sample(logits, params, ids, logprobs); });
}

void TimingBackend::LogProbs(gpu::ConstMatrixView logits,
                             absl::Span<const int32_t> ids,
                             absl::Span<float> logprobs) {
  ++times_.host_waits;
  Timed(__func__, Kind::kOther,
        [&] { inner_.LogProbs(logits, ids, logprobs); });
}

}  // namespace mneme::bench
