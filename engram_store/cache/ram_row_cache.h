#ifndef MNEME_ENGRAM_STORE_CACHE_RAM_ROW_CACHE_H_
#define MNEME_ENGRAM_STORE_CACHE_RAM_ROW_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engram_store/cache/row_cache.h"

namespace mneme::engram {

struct RamRowCacheOptions {
  // Bytes of every row: RowBytes(format), 264 for FP8 and 144 for NVFP4.
  // Required, in [1, 65536].
  size_t row_bytes = 0;
  // Memory the cache may use, all of it counted: row payload, keys, index,
  // eviction metadata, ghost entries and the objects themselves. The row
  // capacity follows from it (about row_bytes + 48 bytes per row with the
  // default options; see capacity_rows()). Must leave room for at least one
  // row per shard. Default: 1 GiB.
  uint64_t budget_bytes = uint64_t{1} << 30;
  // Independent shards, each with its own lock, S3-FIFO queues and an equal
  // share of the budget; a key's shard is chosen by its hash. A power of two
  // in [1, 1024]. Default: 16.
  int num_shards = 16;
  // S3-FIFO: share of each shard's rows the small (probation) queue aims at.
  // In (0, 1). Default: 0.1.
  double small_queue_fraction = 0.1;
  // S3-FIFO: ghost entries (keys recently evicted from the small queue) per
  // row of capacity. In [0, 4]. Default: 0.9.
  double ghost_fraction = 0.9;
  // Rows are stored in slabs of about this many bytes (rounded down to a
  // power-of-two number of rows), allocated as the cache fills. In
  // [4 KiB, 1 GiB]. Default: 2 MiB.
  size_t slab_bytes = size_t{2} << 20;
};

// The RAM tier of the row cache: encoded rows in memory under a strict byte
// budget, evicted by S3-FIFO (see S3FifoPolicy for why and how).
//
// Layout: `num_shards` shards, each with a fixed row capacity derived from
// its share of the budget. A shard stores rows in slabs (one allocation per
// ~slab_bytes, never one per row), each slot holding the packed key and the
// row; a TagTable maps key hashes to slots; an S3FifoPolicy picks slots for
// new rows. Metadata for the full capacity (~40 bytes per row) is allocated
// at Create() and counted from then on; slabs are allocated as slots are
// first used. stats().bytes_in_use counts every one of these bytes (all but
// the allocator's own headers) and never exceeds budget_bytes.
//
// Lookups take their shards' locks shared: a hit only bumps a relaxed atomic
// frequency, so lookups of a shard run in parallel. A lookup holds the reader
// locks of all shards its rows fall in for up to 256 rows at a time (so the
// memory accesses of rows in different shards overlap); an insert takes one
// shard's lock exclusively for at most 512 rows at a time.
//
// Thread-safe. Nothing is ever freed before destruction.
class RamRowCache final : public RowCache {
 public:
  // InvalidArgument naming the field for bad options (including a budget too
  // small for one row per shard).
  static absl::StatusOr<std::unique_ptr<RamRowCache>> Create(
      const RamRowCacheOptions& options);

  RamRowCache(const RamRowCache&) = delete;
  RamRowCache& operator=(const RamRowCache&) = delete;
  ~RamRowCache() override;

  size_t row_bytes() const override { return options_.row_bytes; }

  // See RowCache. Never fails other than with InvalidArgument.
  absl::StatusOr<size_t> LookupBatch(uint32_t table,
                                     absl::Span<const int64_t> ids,
                                     absl::Span<uint8_t> dst,
                                     std::vector<bool>* hits) override;

  // See RowCache. Rows are always admitted (evicting others as S3-FIFO
  // decides). Never fails other than with InvalidArgument.
  absl::Status InsertBatch(uint32_t table, absl::Span<const int64_t> ids,
                           absl::Span<const uint8_t> rows) override;

  RowCacheStats GetStats() const override;

  // Rows the cache holds when full.
  uint64_t capacity_rows() const { return capacity_rows_; }

 private:
  struct Shard;
  // A batch chunk's positions grouped by shard.
  struct Grouping;

  RamRowCache(const RamRowCacheOptions& options, int shard_bits,
              uint32_t rows_per_shard, size_t slot_bytes, int slab_shift);

  // Bytes one shard uses when it holds `rows` rows.
  static uint64_t ShardBytes(const RamRowCacheOptions& options,
                             size_t slot_bytes, int slab_shift, uint32_t rows);

  // The slot's packed key and row bytes. Callers hold shard.mu (the
  // analysis cannot see that through the lookup predicates).
  uint8_t* SlotAddress(const Shard& shard,
                       uint32_t slot) const ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Prefetches the index bucket of every row of a grouped chunk, without
  // locks: bucket addresses depend only on each index's fixed geometry.
  void PrefetchBuckets(const Grouping& g,
                       size_t count) const ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Looks up the rows of a grouped chunk (positions begin .. begin + count
  // of the batch) holding the reader locks of all its shards at once.
  size_t LookupChunk(const Grouping& g, size_t begin, size_t count,
                     uint8_t* dst, std::vector<bool>* hits) const
      ABSL_NO_THREAD_SAFETY_ANALYSIS;

  void Group(uint32_t table, absl::Span<const int64_t> ids, size_t begin,
             size_t count, Grouping* grouping) const;

  const RamRowCacheOptions options_;
  const int shard_bits_;
  const uint32_t rows_per_shard_;
  const uint64_t capacity_rows_;
  // Bytes of one slot: packed key + row, rounded up to 8.
  const size_t slot_bytes_;
  // Slots per slab: a power of two.
  const int slab_shift_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_RAM_ROW_CACHE_H_
