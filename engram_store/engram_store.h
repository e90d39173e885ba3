#ifndef MNEME_ENGRAM_STORE_ENGRAM_STORE_H_
#define MNEME_ENGRAM_STORE_ENGRAM_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"
#include "engram_store/cache/ram_row_cache.h"
#include "engram_store/cache/rocksdb_row_cache.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/column_split.h"
#include "engram_store/io/row_file.h"
#include "engram_store/io/row_reader.h"
#include "engram_store/local_copy/local_copy.h"

namespace mneme::engram {

// Which engine reads rows from disk.
enum class IoBackend {
  // A pool of threads issuing pread(2) (PreadPoolReader).
  kPread = 0,
  // io_uring (UringRowReader); Create() fails with Unavailable where the
  // kernel refuses io_uring, so the caller can choose kPread.
  kUring = 1,
};

// What a lookup returns per value.
enum class RowEncoding {
  // The stored bytes: RowBytes(format) per row, weight bytes then scales.
  kRaw = 0,
  // bf16 (little-endian uint16), kRowDim per row.
  kBf16 = 1,
  // fp32, kRowDim per row.
  kFp32 = 2,
};

// Bytes of one row in `encoding` for a table of `format`.
size_t EncodedRowBytes(RowEncoding encoding, formats::RowFormat format);

struct EngramStoreOptions {
  // The checkpoint directory (local NVMe or NFS). Required.
  std::string checkpoint_dir;
  // How the checkpoint's shards are opened: kBuffered (local disk, page
  // cache allowed), kDirect (O_DIRECT: no page cache, whole 4 KiB pages) or
  // kNfs (buffered, no readahead, pages released after each read).
  // Default: kBuffered.
  OpenMode source_open_mode = OpenMode::kBuffered;
  // A sparse local copy of this store's rows (`mneme localize`), read with
  // local_open_mode; rows it does not cover (or cannot read) come from the
  // checkpoint. Default: "" (none).
  std::string local_copy_dir;
  // Default: kBuffered.
  OpenMode local_open_mode = OpenMode::kBuffered;
  // Tensor-parallel size and the ranks this store serves (one per GPU of
  // the node), and how the hash columns are split across ranks. A row id
  // outside the served ranks' ranges is refused with OutOfRange. Default:
  // TP 1, rank 0, strided.
  int tp_size = 1;
  std::vector<int> ranks = {0};
  ColumnSplit split = ColumnSplit::kStrided;
  // RAM row cache budget in bytes (all of its memory counted). 0 disables
  // the RAM cache. Default: 1 GiB.
  uint64_t ram_cache_bytes = uint64_t{1} << 30;
  // A persistent RocksDB row tier on local disk, for checkpoints on remote
  // storage: read-through, warm across restarts. Default: "" (none).
  std::string rocksdb_dir;
  // Disk budget of the RocksDB tier in bytes; at least 8 MiB + 4 x
  // rocksdb_write_buffer_bytes. Default: 64 GiB.
  uint64_t rocksdb_budget_bytes = uint64_t{64} << 30;
  // RocksDB memtable (and table file) size: the unit in which the oldest
  // rows are dropped. Default: 64 MiB.
  uint64_t rocksdb_write_buffer_bytes = uint64_t{64} << 20;
  // Default: kPread.
  IoBackend io_backend = IoBackend::kPread;
  // Reader threads (kPread) or rings (kUring). Default: 16.
  int io_threads = 16;
  // Most rows waiting to be prefetched; further Prefetch() calls are
  // dropped, never blocking the caller. Default: 1,048,576.
  int64_t prefetch_queue_rows = int64_t{1} << 20;
  // Threads running prefetches. Default: 2.
  int prefetch_threads = 2;
  // How long one prefetch batch may take. Default: 10 s.
  absl::Duration prefetch_timeout = absl::Seconds(10);
};

// The checks Create() makes of `options` before any I/O (InvalidArgument
// naming the option), for a daemon's --check_config.
absl::Status ValidateEngramStoreOptions(const EngramStoreOptions& options);

// Counters of a store since Create().
struct EngramStoreStats {
  uint64_t lookups = 0;            // Lookup calls.
  uint64_t rows_requested = 0;     // Row ids asked for, duplicates included.
  uint64_t rows_unique = 0;        // After deduplication within requests.
  uint64_t ram_hits = 0;           // Unique rows served by the RAM cache.
  uint64_t rocksdb_hits = 0;       // ... by the RocksDB tier.
  uint64_t local_rows = 0;         // ... read from the local copy.
  uint64_t source_rows = 0;        // ... read from the checkpoint.
  uint64_t local_fallbacks = 0;    // Local-copy reads that failed and were
                                   // re-read from the checkpoint.
  uint64_t prefetch_accepted = 0;  // Rows queued by Prefetch().
  uint64_t prefetch_dropped = 0;   // Rows dropped because the queue was full.
  uint64_t prefetch_queued = 0;    // Rows waiting now.
};

// One node's Engram store: serves the rows of its ranks' hash columns of
// every Engram table of a checkpoint, from the RAM cache, the RocksDB tier,
// the sparse local copy or the checkpoint itself, in that order, and decodes
// them on the CPU.
//
// A lookup validates every id (OutOfRange for an id past the table or not
// served by this store's ranks), deduplicates ids, looks the unique rows up
// tier by tier, reads the misses in one batch through the RowReader (the
// local copy where it covers a row, else the checkpoint; a failed local read
// is retried from the checkpoint), fills the caches it passed, and writes
// the rows in request order. Every tier is bounded by its byte budget.
//
// Thread-safe: any number of threads may look up and prefetch at once.
class EngramStore {
 public:
  // Opens and verifies the checkpoint (config, tokenizer, shards), the local
  // copy (manifest against the checkpoint and the rank assignment), the
  // caches and the reader. `metrics` (may be null) receives the store's
  // metrics and must outlive it. `reader` (may be null) replaces the reader
  // the options describe (for fault injection in tests). InvalidArgument
  // naming the option for bad options; errors of the checkpoint, the local
  // copy and the tiers otherwise.
  static absl::StatusOr<std::unique_ptr<EngramStore>> Create(
      const EngramStoreOptions& options, MetricsRegistry* metrics = nullptr,
      std::unique_ptr<RowReader> reader = nullptr);

  EngramStore(const EngramStore&) = delete;
  EngramStore& operator=(const EngramStore&) = delete;
  // Stops the prefetch threads (queued prefetches are dropped).
  ~EngramStore();

  const EngramCheckpoint& checkpoint() const { return *checkpoint_; }
  const EngramStoreOptions& options() const { return options_; }
  // The columns this store serves (union over its ranks), ascending.
  const std::vector<int>& columns() const { return columns_; }
  // The coalesced row ranges this store serves in each table, by the
  // table's position in checkpoint().tables().
  const std::vector<std::vector<RowRange>>& served_ranges() const {
    return served_;
  }
  // True when row `id` of `layer` is in this store's ranges.
  bool Serves(int layer, int64_t id) const;

  // Rows `ids` of Engram layer `layer` in `encoding` into `out`
  // (ids.size() * EncodedRowBytes(encoding, format) bytes).
  // InvalidArgument: not an Engram layer, wrong output size.
  // OutOfRange: an id outside the table or not served here (naming it).
  // DeadlineExceeded: `deadline` passed before the rows were read.
  // DataLoss: a shard is corrupt or was truncated (naming it).
  absl::Status Lookup(int layer, absl::Span<const int64_t> ids,
                      RowEncoding encoding, absl::Span<uint8_t> out,
                      absl::Time deadline);

  // Warms rows into the caches in the background. Returns how many were
  // queued: 0 when the queue is full (the batch is dropped, never blocking)
  // or nothing needed queueing. Ids not served here are ignored.
  int64_t Prefetch(int layer, absl::Span<const int64_t> ids);

  // Prefetch() of the rows that `tokens` (preceded in their sequence by
  // `context`, oldest first) select in every column this store serves: what
  // the coordinator calls for the next prefill chunk. Returns the rows
  // queued; OutOfRange for a token outside the vocabulary, InvalidArgument
  // for a layer without Engram.
  absl::StatusOr<int64_t> PrefetchTokens(int layer,
                                         absl::Span<const int64_t> context,
                                         absl::Span<const int64_t> tokens);

  EngramStoreStats GetStats() const;
  // The RAM cache tier's own counters; nullptr when disabled.
  const RamRowCache* ram_cache() const { return ram_cache_.get(); }
  const RocksDbRowCache* rocksdb_cache() const { return rocksdb_.get(); }

 private:
  struct Table {
    const checkpoint::EngramTableLocation* location = nullptr;
    std::unique_ptr<RowFile> weight_file;
    std::unique_ptr<RowFile> scale_file;  // Same file as weight_file mostly.
    std::unique_ptr<RowFile> local_file;  // Null without a local copy.
  };
  struct PrefetchItem {
    int layer = 0;
    std::vector<int64_t> ids;
  };
  struct Metrics;

  explicit EngramStore(const EngramStoreOptions& options);

  absl::StatusOr<size_t> TableIndex(int layer) const;
  // Raw rows of unique, validated ids.
  absl::Status FetchUnique(size_t table, absl::Span<const int64_t> ids,
                           absl::Span<uint8_t> out, absl::Time deadline);
  absl::Status ReadRows(size_t table, absl::Span<const int64_t> ids,
                        absl::Span<uint8_t> out, absl::Time deadline,
                        bool use_local);
  void PrefetchLoop();

  const EngramStoreOptions options_;
  std::unique_ptr<EngramCheckpoint> checkpoint_;
  std::vector<Table> tables_;
  std::vector<int> columns_;
  std::vector<std::vector<RowRange>> served_;
  std::unique_ptr<LocalCopy> local_copy_;
  std::unique_ptr<RamRowCache> ram_cache_;
  std::unique_ptr<RocksDbRowCache> rocksdb_;
  std::unique_ptr<RowReader> reader_;
  std::unique_ptr<Metrics> metrics_;

  std::atomic<uint64_t> lookups_{0}, rows_requested_{0}, rows_unique_{0},
      ram_hits_{0}, rocksdb_hits_{0}, local_rows_{0}, source_rows_{0},
      local_fallbacks_{0}, prefetch_accepted_{0}, prefetch_dropped_{0};

  mutable absl::Mutex prefetch_mu_;
  std::deque<PrefetchItem> prefetch_queue_ ABSL_GUARDED_BY(prefetch_mu_);
  int64_t prefetch_queued_rows_ ABSL_GUARDED_BY(prefetch_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(prefetch_mu_) = false;
  std::vector<std::thread> prefetch_threads_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_ENGRAM_STORE_H_
