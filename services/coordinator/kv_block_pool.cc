#include "services/coordinator/kv_block_pool.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mneme::coordinator {
namespace {

// Longest sequence the pool accounts for; keeps every product in range.
constexpr int64_t kMaxLength = int64_t{1} << 40;
// More ranks than any cluster this serves; bounds the per-rank tables.
constexpr int kMaxDcpSize = 4096;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(
    const KvBlockPoolOptions& options) {
  if (options.bytes_per_rank <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes_per_rank must be positive, got ", options.bytes_per_rank));
  }
  if (options.bytes_per_token <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_token must be positive (derive it from the "
                     "model), got ",
                     options.bytes_per_token));
  }
  if (options.block_size_tokens <= 0 ||
      options.block_size_tokens > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size_tokens must be in [1, 2^40], got ",
                     options.block_size_tokens));
  }
  if (options.dcp_size < 1 || options.dcp_size > kMaxDcpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp_size must be in [1, ", kMaxDcpSize, "], got ", options.dcp_size));
  }
  if (options.dcp_interleave < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp_interleave must be >= 1, got ", options.dcp_interleave));
  }
  if (options.sliding_window_tokens < 0 ||
      options.sliding_window_tokens > kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window_tokens must be in [0, 2^40], got ",
                     options.sliding_window_tokens));
  }
  // Two floor divisions equal one by the product, which might overflow.
  const int64_t blocks = options.bytes_per_rank / options.block_size_tokens /
                         options.bytes_per_token;
  if (blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes_per_rank (", options.bytes_per_rank,
        ") holds no block of block_size_tokens x bytes_per_token (",
        options.block_size_tokens, " x ", options.bytes_per_token, ")"));
  }
  return std::unique_ptr<KvBlockPool>(new KvBlockPool(options, blocks));
}

KvBlockPool::KvBlockPool(const KvBlockPoolOptions& options,
                         int64_t blocks_per_rank)
    : dcp_size_(options.dcp_size),
      dcp_interleave_(options.dcp_interleave),
      block_size_(options.block_size_tokens),
      window_(options.sliding_window_tokens),
      block_bytes_(options.block_size_tokens * options.bytes_per_token),
      blocks_per_rank_(blocks_per_rank),
      used_(options.dcp_size, 0) {}

int KvBlockPool::OwnerRank(int64_t position) const {
  CHECK_GE(position, 0);
  return static_cast<int>((position / dcp_interleave_) % dcp_size_);
}

int64_t KvBlockPool::OwnedTokens(int rank, int64_t length) const {
  CHECK(rank >= 0 && rank < dcp_size_) << "rank " << rank;
  if (length <= 0) return 0;
  const int64_t interleave = dcp_interleave_;
  const int64_t period = interleave * dcp_size_;
  const int64_t rest = length % period - rank * interleave;
  return length / period * interleave +
         std::clamp<int64_t>(rest, 0, interleave);
}

int64_t KvBlockPool::BlocksFor(int rank, int64_t length) const {
  if (length <= 0) return 0;
  return CeilDiv(OwnedTokens(rank, length), block_size_) +
         CeilDiv(std::min(length, window_), block_size_);
}

bool KvBlockPool::Needed(const Sequence* seq, int64_t new_length,
                         PerRank& add) const {
  add.assign(dcp_size_, 0);
  bool fits = true;
  for (int r = 0; r < dcp_size_; ++r) {
    const int64_t held = seq == nullptr ? 0 : seq->blocks[r];
    add[r] = BlocksFor(r, new_length) - held;
    if (add[r] > blocks_per_rank_ - used_[r]) fits = false;
  }
  return fits;
}

bool KvBlockPool::CanAllocate(SequenceId id, int64_t num_new_tokens) const {
  if (num_new_tokens < 0) return false;
  if (num_new_tokens == 0) return true;
  auto it = seqs_.find(id);
  const Sequence* seq = it == seqs_.end() ? nullptr : &it->second;
  const int64_t length = seq == nullptr ? 0 : seq->length;
  if (num_new_tokens > kMaxLength - length) return false;
  PerRank add;
  return Needed(seq, length + num_new_tokens, add);
}

absl::Status KvBlockPool::Allocate(SequenceId id, int64_t num_new_tokens) {
  if (num_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_new_tokens must be >= 0, got ", num_new_tokens));
  }
  if (num_new_tokens == 0) return absl::OkStatus();
  auto it = seqs_.find(id);
  Sequence* seq = it == seqs_.end() ? nullptr : &it->second;
  const int64_t length = seq == nullptr ? 0 : seq->length;
  if (num_new_tokens > kMaxLength - length) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", id, " would grow past 2^40 tokens"));
  }
  const int64_t new_length = length + num_new_tokens;
  PerRank add;
  if (!Needed(seq, new_length, add)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV pool full: sequence ", id, " cannot grow from ",
                     length, " to ", new_length, " tokens"));
  }
  if (seq == nullptr) {
    seq = &seqs_[id];
    seq->blocks.assign(dcp_size_, 0);
  }
  seq->length = new_length;
  for (int r = 0; r < dcp_size_; ++r) {
    seq->blocks[r] += add[r];
    used_[r] += add[r];
    total_used_ += add[r];
  }
  return absl::OkStatus();
}

absl::Status KvBlockPool::Free(SequenceId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("KV pool holds nothing for sequence ", id));
  }
  for (int r = 0; r < dcp_size_; ++r) {
    used_[r] -= it->second.blocks[r];
    total_used_ -= it->second.blocks[r];
  }
  seqs_.erase(it);
  return absl::OkStatus();
}

int64_t KvBlockPool::length(SequenceId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.length;
}

std::vector<int64_t> KvBlockPool::SequenceBlocks(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return std::vector<int64_t>(dcp_size_, 0);
  return std::vector<int64_t>(it->second.blocks.begin(),
                              it->second.blocks.end());
}

double KvBlockPool::Usage(int rank) const {
  return static_cast<double>(used_[rank]) /
         static_cast<double>(blocks_per_rank_);
}

double KvBlockPool::TotalUsage() const {
  return static_cast<double>(total_used_) / static_cast<double>(total_blocks());
}

}  // namespace mneme::coordinator
