#ifndef MNEME_ENGRAM_STORE_CACHE_ROCKSDB_ROW_CACHE_H_
#define MNEME_ENGRAM_STORE_CACHE_ROCKSDB_ROW_CACHE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engram_store/cache/row_cache.h"

namespace rocksdb {
class Cache;
class ColumnFamilyHandle;
class DB;
}  // namespace rocksdb

namespace mneme::engram {

struct RocksDbRowCacheOptions {
  // Directory of the database. Created if missing. It belongs to the cache:
  // on a rebuild everything in it is deleted, so Create() refuses a
  // non-empty directory that was not created by a row cache (one without
  // the MNEME_ROW_CACHE file). Required.
  std::string path;
  // Identity of the rows' source, e.g. SourceFingerprint() of the checkpoint
  // shards (path, size, mtime) plus the format. Stored in the database; when
  // it differs from the stored one the database is wiped and rebuilt, so a
  // different checkpoint or format never serves stale rows. Required,
  // non-empty.
  std::string source_id;
  // Bytes of every row: RowBytes(format). Part of the identity too.
  // Required, in [1, 65536].
  size_t row_bytes = 0;
  // Disk bytes the database directory may occupy, all files counted. See
  // RocksDbRowCache for how it is enforced. Must be at least
  // 8 MiB + 4 * write_buffer_bytes. Default: 64 GiB.
  uint64_t budget_bytes = uint64_t{64} << 30;
  // Size of one memtable (RAM; two at most) and so of one table file on
  // disk: the unit in which the oldest rows are dropped. Fewer, larger files
  // make lookups cheaper (every file is a candidate for every key). In
  // [64 KiB, 1 GiB]. Default: 64 MiB.
  uint64_t write_buffer_bytes = uint64_t{64} << 20;
  // RAM for RocksDB's block cache (index and filter blocks first, then data
  // blocks). In [1 MiB, 64 GiB]. Default: 64 MiB.
  uint64_t block_cache_bytes = uint64_t{64} << 20;
  // Bloom filter bits per row (about 1% false positives per file at 10); 0
  // disables filters. In [0, 32]. Default: 10.
  int bloom_bits_per_key = 10;
  // Read table files with O_DIRECT, bypassing the page cache (which would
  // otherwise grow with the working set; see ENGRAM.md on GB10). Create()
  // checks that the filesystem supports it. Default: false.
  bool direct_reads = false;
};

// How Create() found the database.
enum class RocksDbOpenOutcome {
  // No database was there: a new, empty one was created.
  kCreated = 1,
  // The existing database was opened with its rows.
  kReopened = 2,
  // The database could not be opened (corrupt or unreadable files) or had
  // no identity record: it was deleted and a new, empty one created. A
  // warning was logged.
  kRebuiltCorrupt = 3,
  // The stored source identity (source_id, row_bytes, layout version)
  // differed: the database was deleted and a new, empty one created. A
  // warning was logged.
  kRebuiltSourceChanged = 4,
};

const char* RocksDbOpenOutcomeName(RocksDbOpenOutcome outcome);

// The persistent tier of the row cache: rows in a RocksDB database on local
// disk, for tables whose source is remote (NFS). Read-through: the store
// calls LookupBatch, reads misses from the source and InsertBatch-es them.
// Rows survive restarts (reopen -> hits).
//
// Layout: rows live in column family "rows", key = 8 bytes big-endian
// (table << 48 | row), value = the row's bytes. The default column family
// holds the identity record (see RocksDbRowCacheOptions::source_id).
//
// Size bound: "rows" uses FIFO compaction: all table files stay in L0 and
// when their total exceeds compaction_options_fifo.max_table_files_size the
// oldest files are deleted, i.e. eviction is FIFO by insertion in units of
// one file (about write_buffer_bytes). That limit is set to
// budget_bytes - 2 * write_buffer_bytes - 8 MiB: two write buffers cover the
// file(s) flushed before the next FIFO deletion runs, 8 MiB covers the
// MANIFEST (capped at 1 MiB, two during a roll), the info LOG (1 MiB files,
// 2 old ones kept), OPTIONS, the identity record and the marker file. So the
// directory stays within budget_bytes (tested by writing many times the
// budget). TTL-based deletion is off.
//
// Integrity: block checksums (XXH3) are verified on every read; a value whose
// length is not row_bytes, or a read that fails a checksum, is a miss
// (stats().corrupt_rows) and the next insert of that row shadows it. No
// per-row CRC: RocksDB's block checksums already cover every byte read from
// disk. A database that cannot be opened (corrupt CURRENT, MANIFEST or
// tables, garbage files) is deleted and rebuilt empty (kRebuiltCorrupt),
// never fatal.
//
// Writes: one WriteBatch per InsertBatch, WAL disabled (it is a cache: rows
// still in the memtable are lost by a crash, never corrupted; Close flushes
// them), and no_slowdown, so an insert never waits for a RocksDB write stall:
// under write pressure the batch is dropped (stats().dropped_inserts).
// RocksDB lookups never wait for writes (they read a consistent version
// without locks).
//
// Costs: a lookup checks the Bloom filter of every table file (all are in
// L0, newest first), so lookups get slower as budget / write_buffer_bytes
// grows; RAM is the block cache plus up to two write buffers.
//
// A lock file (MNEME_ROW_CACHE, also the ownership marker) keeps two caches
// from using one directory, even within one process.
//
// Thread-safe.
class RocksDbRowCache final : public RowCache {
 public:
  // Validates options (InvalidArgument naming the field, including
  // direct_reads on a filesystem without O_DIRECT), then opens, creates or
  // rebuilds the database as described above. FailedPrecondition if `path`
  // is not a directory, is a non-empty directory not created by a row cache
  // (even a RocksDB database: it is never wiped), or is in use by another
  // cache; Unavailable (or DataLoss) if even a fresh database cannot be
  // created there.
  static absl::StatusOr<std::unique_ptr<RocksDbRowCache>> Create(
      const RocksDbRowCacheOptions& options);

  RocksDbRowCache(const RocksDbRowCache&) = delete;
  RocksDbRowCache& operator=(const RocksDbRowCache&) = delete;
  // Flushes the memtables (so the rows are there after a restart) and
  // closes the database.
  ~RocksDbRowCache() override;

  size_t row_bytes() const override { return options_.row_bytes; }

  // See RowCache. Rows that fail to read are misses, counted in
  // corrupt_rows / read_errors.
  absl::StatusOr<size_t> LookupBatch(uint32_t table,
                                     absl::Span<const int64_t> ids,
                                     absl::Span<uint8_t> dst,
                                     std::vector<bool>* hits) override;

  // See RowCache. OK also when the batch was dropped because RocksDB is
  // stalling writes (counted in dropped_inserts). Unavailable for an I/O
  // error, DataLoss for corruption, Internal otherwise; the caller may
  // ignore these (the rows are simply not cached).
  absl::Status InsertBatch(uint32_t table, absl::Span<const int64_t> ids,
                           absl::Span<const uint8_t> rows) override;

  // bytes_in_use = table files of both column families on disk.
  RowCacheStats GetStats() const override;

  RocksDbOpenOutcome open_outcome() const { return outcome_; }

 private:
  RocksDbRowCache(const RocksDbRowCacheOptions& options, int lock_fd);

  // Opens (or creates) the database at options_.path into db_ / handles.
  absl::Status OpenDb();
  void CloseDb();
  // Deletes everything in the directory but the lock file.
  absl::Status Wipe();
  // Creates a fresh database after a wipe (or none) and writes the identity.
  absl::Status CreateFresh();
  std::string Identity() const;

  const RocksDbRowCacheOptions options_;
  // Held (flock) for the lifetime of the object.
  const int lock_fd_;
  RocksDbOpenOutcome outcome_ = RocksDbOpenOutcome::kCreated;

  // Shared by both column families' table options (RocksDB's API takes a
  // shared_ptr).
  std::shared_ptr<rocksdb::Cache> block_cache_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* meta_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* rows_cf_ = nullptr;

  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
  std::atomic<uint64_t> inserts_{0};
  std::atomic<uint64_t> corrupt_rows_{0};
  std::atomic<uint64_t> read_errors_{0};
  std::atomic<uint64_t> dropped_inserts_{0};
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_ROCKSDB_ROW_CACHE_H_
