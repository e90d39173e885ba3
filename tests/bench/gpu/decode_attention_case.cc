#include "tests/bench/gpu/decode_attention_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::bench {

using gpu::ConstMatrixView;
using gpu::MatrixView;

namespace {

constexpr float kScale = 0.044194173f;  // 1 / sqrt(512)

absl::StatusOr<std::unique_ptr<gpu::Buffer>> Random(gpu::Backend& backend,
                                                    int64_t n,
                                                    std::mt19937& rng) {
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> buffer, backend.Allocate(n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = u(rng);
  backend.CopyFromHost(values, buffer->data());
  return buffer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeAttentionCase>>
DecodeAttentionCase::Create(gpu::Backend& backend, int sequences,
                            uint32_t seed) {
  if (sequences < 1 || int64_t{sequences} * kKeys > kPoolRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequences ", sequences, " not in [1, ", kPoolRows / kKeys, "]"));
  }
  std::unique_ptr<DecodeAttentionCase> c(
      new DecodeAttentionCase(backend, sequences));
  std::mt19937 rng(seed);
  const int64_t width = int64_t{kHeads} * kHeadDim;
  ASSIGN_OR_RETURN(c->pool_, Random(backend, kPoolRows * kHeadDim, rng));
  ASSIGN_OR_RETURN(c->q_, Random(backend, sequences * width, rng));
  ASSIGN_OR_RETURN(c->kv_, Random(backend, sequences * kHeadDim, rng));
  ASSIGN_OR_RETURN(c->sink_, Random(backend, kHeads, rng));
  ASSIGN_OR_RETURN(c->keys_, backend.Allocate(int64_t{kKeys} * kHeadDim));
  ASSIGN_OR_RETURN(c->tail_, backend.Allocate(kHeadDim));
  ASSIGN_OR_RETURN(c->out_, backend.Allocate(sequences * width));
  ASSIGN_OR_RETURN(c->lse_, backend.Allocate(int64_t{sequences} * kHeads));
  // Each sequence's keys: distinct pool rows, its window in ring blocks of
  // 16 rows, its entries anywhere.
  std::vector<int32_t> blocks(kPoolRows / 16);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<int32_t> free_rows;
  for (size_t b = static_cast<size_t>(sequences) * kWindow / 16;
       b < blocks.size(); ++b) {
    for (int r = 0; r < 16; ++r) free_rows.push_back(blocks[b] * 16 + r);
  }
  std::shuffle(free_rows.begin(), free_rows.end(), rng);
  size_t next_block = 0, next_row = 0;
  for (int s = 0; s < sequences; ++s) {
    std::vector<int32_t>& window = c->window_rows_.emplace_back();
    for (int b = 0; b < kWindow / 16; ++b, ++next_block) {
      for (int r = 0; r < 16; ++r)
        window.push_back(blocks[next_block] * 16 + r);
    }
    std::vector<int32_t>& entries = c->entry_rows_.emplace_back(
        free_rows.begin() + next_row, free_rows.begin() + next_row + kSelected);
    next_row += kSelected;
    c->ring_rows_.push_back(window.back());
    c->pool_idx_.insert(c->pool_idx_.end(), window.begin(), window.end());
    c->pool_idx_.insert(c->pool_idx_.end(), entries.begin(), entries.end());
  }
  c->copy_idx_.resize(kKeys);
  std::iota(c->copy_idx_.begin(), c->copy_idx_.end(), 0);
  return c;
}

void DecodeAttentionCase::Gathered() {
  const int64_t width = int64_t{kHeads} * kHeadDim;
  const MatrixView pool = pool_->view(kPoolRows, kHeadDim);
  const MatrixView keys = keys_->view(kKeys, kHeadDim);
  const std::vector<int32_t> own = {0};
  for (int s = 0; s < sequences_; ++s) {
    const ConstMatrixView kv(kv_->data() + s * kHeadDim, 1, kHeadDim);
    const absl::Span<const int32_t> window(window_rows_[s]);
    backend_.GatherRows(pool, window.subspan(0, kWindow - 1),
                        MatrixView{keys.data, kWindow - 1, kHeadDim});
    backend_.GatherRows(
        kv, own, MatrixView{keys.data + (kWindow - 1) * kHeadDim, 1, kHeadDim});
    backend_.GatherRows(
        pool, entry_rows_[s],
        MatrixView{keys.data + kWindow * kHeadDim, kSelected, kHeadDim});
    backend_.SparseAttention(
        ConstMatrixView(q_->data() + s * width, 1, width), keys, kHeads,
        copy_idx_, kKeys, kScale, sink_->data(),
        MatrixView{out_->data() + s * width, 1, width},
        MatrixView{lse_->data() + int64_t{s} * kHeads, 1, kHeads});
    backend_.GatherRows(kv, own, tail_->view(1, kHeadDim));
    backend_.ScatterRows(tail_->view(1, kHeadDim), window.subspan(kWindow - 1),
                         pool);
  }
}

void DecodeAttentionCase::InPlace() {
  const int64_t width = int64_t{kHeads} * kHeadDim;
  const MatrixView pool = pool_->view(kPoolRows, kHeadDim);
  backend_.ScatterRows(kv_->view(sequences_, kHeadDim), ring_rows_, pool);
  backend_.SparseAttention(q_->view(sequences_, width), pool, kHeads, pool_idx_,
                           kKeys, kScale, sink_->data(),
                           out_->view(sequences_, width),
                           lse_->view(sequences_, kHeads));
}

absl::Status DecodeAttentionCase::Matches(float tolerance) {
  const int64_t width = int64_t{kHeads} * kHeadDim;
  std::vector<float> out_a(sequences_ * width);
  std::vector<float> lse_a(int64_t{sequences_} * kHeads);
  std::vector<float> out_b(out_a.size()), lse_b(lse_a.size());
  Gathered();
  backend_.CopyToHost(out_->data(), absl::MakeSpan(out_a));
  backend_.CopyToHost(lse_->data(), absl::MakeSpan(lse_a));
  InPlace();
  backend_.CopyToHost(out_->data(), absl::MakeSpan(out_b));
  backend_.CopyToHost(lse_->data(), absl::MakeSpan(lse_b));
  RETURN_IF_ERROR(backend_.Synchronize());
  for (const auto& [a, b] : {std::pair{&out_a, &out_b}, {&lse_a, &lse_b}}) {
    float largest = 0, diff = 0;
    for (size_t i = 0; i < a->size(); ++i) {
      if (!std::isfinite((*a)[i]) || !std::isfinite((*b)[i])) {
        return absl::InternalError(absl::StrCat("non-finite value at ", i));
      }
      largest = std::max(largest, std::fabs((*a)[i]));
      diff = std::max(diff, std::fabs((*a)[i] - (*b)[i]));
    }
    if (diff > tolerance * std::max(largest, 1.0f)) {
      return absl::InternalError(
          absl::StrCat("gathered and in-place attention differ by ", diff,
                       " (largest ", largest, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::bench
