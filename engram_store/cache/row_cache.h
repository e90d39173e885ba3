#ifndef MNEME_ENGRAM_STORE_CACHE_ROW_CACHE_H_
#define MNEME_ENGRAM_STORE_CACHE_ROW_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mneme::engram {

// Largest table id a row cache accepts (table ids are Engram layer ids).
inline constexpr uint32_t kMaxRowCacheTableId = 0xFFFF;
// Largest row id a row cache accepts (2^48 - 1; tables have ~384M rows).
inline constexpr int64_t kMaxRowCacheRowId = (int64_t{1} << 48) - 1;

// Counters and gauges of one cache tier. Counters count rows, not calls.
struct RowCacheStats {
  // Rows asked for by LookupBatch (= hits + misses).
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  // Rows written by InsertBatch (new keys and overwrites).
  uint64_t inserts = 0;
  // Rows dropped to make room (RAM tier). The RocksDB tier drops whole files
  // and does not count rows: always 0 there.
  uint64_t evictions = 0;
  // Rows resident now (RAM tier: exact; RocksDB tier: RocksDB's estimate).
  uint64_t entries = 0;
  // Bytes the tier holds now, counted the way its budget is: RAM tier, every
  // byte it allocated (row payload, keys, index, eviction metadata);
  // RocksDB tier, the table files on disk.
  uint64_t bytes_in_use = 0;
  // The configured budget for bytes_in_use.
  uint64_t budget_bytes = 0;
  // Rows that read back with a bad length or failed RocksDB's checksums;
  // served as misses (RocksDB tier only).
  uint64_t corrupt_rows = 0;
  // Rows whose read failed for another reason; served as misses (RocksDB
  // tier only).
  uint64_t read_errors = 0;
  // Rows not cached because the tier was under write pressure (RocksDB tier
  // only; see RocksDbRowCache::InsertBatch).
  uint64_t dropped_inserts = 0;
};

// A cache of encoded Engram rows (RowBytes(format) bytes each: weight bytes
// then scale bytes), keyed by (table id, row id). Tiers: RamRowCache (memory,
// S3-FIFO eviction under a byte budget) and RocksDbRowCache (local disk,
// persistent, for tables whose source is remote). A cache is a hint: a
// lookup may miss any row at any time and the caller then reads the source
// and inserts what it read (read-through).
//
// Every row of one cache has the same size, row_bytes(), fixed at creation.
// Thread-safe: all methods may be called concurrently.
class RowCache {
 public:
  virtual ~RowCache() = default;

  // Bytes of every row this cache holds.
  virtual size_t row_bytes() const = 0;

  // Looks up rows `ids` of `table`. For each i, (*hits)[i] is set to whether
  // row ids[i] was found; if so its bytes are copied to
  // dst[i * row_bytes(), (i + 1) * row_bytes()), otherwise that range is left
  // untouched. `hits` is resized to ids.size(). Duplicate ids are fine.
  // Returns the number of hits. InvalidArgument (and nothing is read) when
  // dst.size() != ids.size() * row_bytes(), `hits` is null, `table` >
  // kMaxRowCacheTableId or an id is outside [0, kMaxRowCacheRowId]. Failures
  // of the tier's storage are not errors: those rows are misses (counted in
  // the stats).
  virtual absl::StatusOr<size_t> LookupBatch(uint32_t table,
                                             absl::Span<const int64_t> ids,
                                             absl::Span<uint8_t> dst,
                                             std::vector<bool>* hits) = 0;

  // Caches rows `ids` of `table`, row i being
  // rows[i * row_bytes(), (i + 1) * row_bytes()); an id already cached is
  // overwritten. The cache may evict other rows, or (per tier) drop these.
  // InvalidArgument (and nothing is written) for the same argument errors as
  // LookupBatch (rows.size() != ids.size() * row_bytes()). Storage failures
  // of a tier are documented by the tier.
  virtual absl::Status InsertBatch(uint32_t table,
                                   absl::Span<const int64_t> ids,
                                   absl::Span<const uint8_t> rows) = 0;

  // A snapshot of the counters (each read atomically, not all together).
  virtual RowCacheStats GetStats() const = 0;

  // One-row forms of LookupBatch / InsertBatch: true on a hit.
  absl::StatusOr<bool> Lookup(uint32_t table, int64_t id,
                              absl::Span<uint8_t> dst) {
    std::vector<bool> hits;
    absl::StatusOr<size_t> n =
        LookupBatch(table, absl::MakeConstSpan(&id, 1), dst, &hits);
    if (!n.ok()) return n.status();
    return *n == 1;
  }
  absl::Status Insert(uint32_t table, int64_t id,
                      absl::Span<const uint8_t> row) {
    return InsertBatch(table, absl::MakeConstSpan(&id, 1), row);
  }
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_ROW_CACHE_H_
