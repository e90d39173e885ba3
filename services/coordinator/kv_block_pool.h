#ifndef MNEME_SERVICES_COORDINATOR_KV_BLOCK_POOL_H_
#define MNEME_SERVICES_COORDINATOR_KV_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mneme::coordinator {

// The coordinator's id of a sequence (the worker protocol's sequence_id).
using SequenceId = uint64_t;

struct KvBlockPoolOptions {
  // KV cache memory of one rank, bytes; rounded down to whole blocks. Every
  // rank has the same. Default: 6 GiB (the reference topology).
  int64_t bytes_per_rank = int64_t{6} << 30;
  // Bytes one token's cached entries take on the rank that holds them, all
  // layers together (derived from the model: for a layer with compress
  // ratio r, its share of an entry over r). Must be set: Default: 0, which
  // Create() rejects.
  int64_t bytes_per_token = 0;
  // Tokens per block. Default: 16 (the worker's kv_block_rows).
  int64_t block_size_tokens = 16;
  // Ranks the long-range entries are spread over (decode context
  // parallelism, N), in [1, 4096]. 1 = one rank holds everything.
  // Default: 1.
  int dcp_size = 1;
  // Consecutive tokens whose long-range entries go to the same rank (I):
  // token t lives on rank (t / I) % N. Default: 1.
  int dcp_interleave = 1;
  // Tokens of the sliding window (W), kept on every rank: a sequence of
  // length L holds min(L, W) window entries on each rank, in a ring of
  // whole blocks. 0 = no window. Default: 128 (the model's sliding_window).
  int64_t sliding_window_tokens = 128;
};

// KV cache accounting for the coordinator: a pool of fixed-size blocks per
// rank, and per sequence the blocks it holds on each rank.
//
// On each rank a sequence of length L holds ceil(E_r(L) / B) blocks of its
// long-range entries, E_r(L) = the tokens t < L with (t / I) % N == r, plus
// ceil(min(L, W) / B) blocks of the replicated sliding window. A sequence
// grows by Allocate() and gives everything back with Free(); a growth takes
// its blocks on every rank or, when any rank lacks room, nothing at all.
//
// The pool counts blocks; it does not name them (each worker places its own
// entries). Deterministic; no I/O. Thread-compatible: the scheduling loop
// owns it.
class KvBlockPool {
 public:
  // InvalidArgument naming the field for a non-positive size, a dcp_size or
  // dcp_interleave below 1, a negative window, or a budget that holds no
  // block.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(
      const KvBlockPoolOptions& options);

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  // The rank holding the long-range entry of the token at `position` (>= 0).
  int OwnerRank(int64_t position) const;
  // Long-range entries of tokens [0, length) held by `rank`.
  int64_t OwnedTokens(int rank, int64_t length) const;
  // Blocks a sequence of `length` tokens holds on `rank` (window included).
  int64_t BlocksFor(int rank, int64_t length) const;

  // Grows `id` from its length L (0 for a sequence the pool does not hold)
  // to L + num_new_tokens, taking the blocks this needs on every rank.
  // InvalidArgument for num_new_tokens < 0 or a length past 2^40;
  // ResourceExhausted, with nothing taken, when some rank lacks free blocks.
  // A growth by 0 changes nothing.
  absl::Status Allocate(SequenceId id, int64_t num_new_tokens);
  // Whether Allocate(id, num_new_tokens) would succeed.
  bool CanAllocate(SequenceId id, int64_t num_new_tokens) const;
  // Returns all blocks of `id` to the pool and forgets it. NotFound when the
  // pool holds nothing for it.
  absl::Status Free(SequenceId id);

  // Tokens `id` has blocks for; 0 for an unknown sequence.
  int64_t length(SequenceId id) const;
  // Blocks `id` holds on each rank (dcp_size entries; zeros if unknown).
  std::vector<int64_t> SequenceBlocks(SequenceId id) const;
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  int dcp_size() const { return dcp_size_; }
  int dcp_interleave() const { return dcp_interleave_; }
  int64_t block_size_tokens() const { return block_size_; }
  int64_t sliding_window_tokens() const { return window_; }
  int64_t block_bytes() const { return block_bytes_; }
  // Capacity of each rank, blocks. Every `rank` argument below is in
  // [0, dcp_size).
  int64_t blocks_per_rank() const { return blocks_per_rank_; }
  int64_t used_blocks(int rank) const { return used_[rank]; }
  int64_t free_blocks(int rank) const { return blocks_per_rank_ - used_[rank]; }
  // Over all ranks.
  int64_t total_blocks() const { return blocks_per_rank_ * dcp_size_; }
  int64_t total_used_blocks() const { return total_used_; }
  // Used fraction of one rank, and of all ranks together, in [0, 1].
  double Usage(int rank) const;
  double TotalUsage() const;

 private:
  using PerRank = absl::InlinedVector<int64_t, 8>;
  struct Sequence {
    int64_t length = 0;
    PerRank blocks;
  };

  KvBlockPool(const KvBlockPoolOptions& options, int64_t blocks_per_rank);

  // Blocks each rank must add to grow `seq` (null = empty) to `new_length`;
  // false when some rank lacks room.
  bool Needed(const Sequence* seq, int64_t new_length, PerRank& add) const;

  const int dcp_size_;
  const int dcp_interleave_;
  const int64_t block_size_;
  const int64_t window_;
  const int64_t block_bytes_;
  const int64_t blocks_per_rank_;
  PerRank used_;
  int64_t total_used_ = 0;
  // Looked up only, never iterated: the pool stays deterministic.
  absl::flat_hash_map<SequenceId, Sequence> seqs_;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_KV_BLOCK_POOL_H_
