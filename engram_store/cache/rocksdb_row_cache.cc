#include "engram_store/cache/rocksdb_row_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engram_store/cache/row_key.h"
#include "glog/logging.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace mneme::engram {
namespace {

namespace fs = std::filesystem;

// The lock file, which also marks the directory as a row cache's.
constexpr char kLockFileName[] = "MNEME_ROW_CACHE";
constexpr char kRowsColumnFamily[] = "rows";
constexpr char kIdentityKey[] = "mneme.row_cache.identity";
// Bumped when the key or value layout changes: old databases are rebuilt.
constexpr int kLayoutVersion = 1;
constexpr size_t kMaxRowBytes = 65536;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// Disk bytes besides table files (see the class comment).
constexpr uint64_t kMiscReserveBytes = 8 * kMiB;
constexpr uint64_t kManifestMaxBytes = 1 * kMiB;
constexpr uint64_t kInfoLogMaxBytes = 1 * kMiB;
constexpr size_t kInfoLogFilesKept = 2;
constexpr size_t kKeyBytes = 8;

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) {
    return absl::OkStatus();
  }
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsCorruption()) {
    return absl::DataLossError(message);
  }
  if (s.IsIOError()) {
    return absl::UnavailableError(message);
  }
  if (s.IsInvalidArgument() || s.IsNotSupported()) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

void EncodeKey(uint32_t table, int64_t row, char* out) {
  const uint64_t key = PackRowKey(table, row);
  for (int b = 0; b < 8; ++b) {
    out[b] = static_cast<char>(key >> (56 - 8 * b));
  }
}

// Whether the filesystem of `dir` accepts O_DIRECT opens.
bool SupportsDirectIo(const std::string& dir) {
  const std::string probe = dir + "/.direct_io_probe";
  const int fd =
      ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return false;
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

absl::Status Validate(const RocksDbRowCacheOptions& o) {
  if (o.path.empty()) {
    return absl::InvalidArgumentError("RocksDbRowCacheOptions.path is empty");
  }
  if (o.source_id.empty()) {
    return absl::InvalidArgumentError(
        "RocksDbRowCacheOptions.source_id is empty");
  }
  if (o.row_bytes < 1 || o.row_bytes > kMaxRowBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RocksDbRowCacheOptions.row_bytes must be in [1, ",
                     kMaxRowBytes, "], got ", o.row_bytes));
  }
  if (o.write_buffer_bytes < uint64_t{64} * 1024 ||
      o.write_buffer_bytes > 1024 * kMiB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbRowCacheOptions.write_buffer_bytes must be in [64 KiB, "
        "1 GiB], got ",
        o.write_buffer_bytes));
  }
  const uint64_t min_budget = kMiscReserveBytes + 4 * o.write_buffer_bytes;
  if (o.budget_bytes < min_budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbRowCacheOptions.budget_bytes must be at least 8 MiB + 4 * "
        "write_buffer_bytes = ",
        min_budget, ", got ", o.budget_bytes));
  }
  if (o.block_cache_bytes < kMiB || o.block_cache_bytes > 65536 * kMiB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbRowCacheOptions.block_cache_bytes must be in [1 MiB, 64 GiB], "
        "got ",
        o.block_cache_bytes));
  }
  if (o.bloom_bits_per_key < 0 || o.bloom_bits_per_key > 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RocksDbRowCacheOptions.bloom_bits_per_key must be in [0, 32], got ",
        o.bloom_bits_per_key));
  }
  return absl::OkStatus();
}

bool IsDirEmptyExcept(const std::string& dir, absl::string_view except) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().filename().string() != except) {
      return false;
    }
  }
  return true;
}

}  // namespace

const char* RocksDbOpenOutcomeName(RocksDbOpenOutcome outcome) {
  switch (outcome) {
    case RocksDbOpenOutcome::kCreated:
      return "created";
    case RocksDbOpenOutcome::kReopened:
      return "reopened";
    case RocksDbOpenOutcome::kRebuiltCorrupt:
      return "rebuilt (corrupt)";
    case RocksDbOpenOutcome::kRebuiltSourceChanged:
      return "rebuilt (source changed)";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<RocksDbRowCache>> RocksDbRowCache::Create(
    const RocksDbRowCacheOptions& options) {
  RETURN_IF_ERROR(Validate(options));

  const std::string& path = options.path;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (!fs::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("row cache: ", path, " is not a directory"));
  }
  const std::string lock_path = path + "/" + kLockFileName;
  const bool marked = fs::exists(lock_path, ec);
  const bool looks_like_rocksdb = fs::exists(path + "/CURRENT", ec);
  // Only a directory this class created (it holds the lock file) is ever
  // wiped: anything else that is not empty, another application's RocksDB
  // database included, is refused.
  if (!marked && !IsDirEmptyExcept(path, "")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "row cache: ", path, " is not empty and is not a row cache (no ",
        kLockFileName, "); refusing to use (and later wipe) it"));
  }
  if (options.direct_reads && !SupportsDirectIo(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RocksDbRowCacheOptions.direct_reads: the filesystem of ",
                     path, " does not support O_DIRECT"));
  }

  const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "row cache: cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("row cache: ", path, " is in use by another row cache (",
                     std::strerror(err), ")"));
  }
  std::unique_ptr<RocksDbRowCache> cache(new RocksDbRowCache(options, fd));

  // No CURRENT but other files: a damaged database (or leftovers).
  if (!looks_like_rocksdb && !IsDirEmptyExcept(path, kLockFileName)) {
    LOG(WARNING) << "row cache " << path
                 << ": no CURRENT file but other files present; rebuilding";
    RETURN_IF_ERROR(cache->CreateFresh());
    cache->outcome_ = RocksDbOpenOutcome::kRebuiltCorrupt;
    return cache;
  }
  if (!looks_like_rocksdb) {
    RETURN_IF_ERROR(cache->CreateFresh());
    cache->outcome_ = RocksDbOpenOutcome::kCreated;
    return cache;
  }

  absl::Status opened = cache->OpenDb();
  if (!opened.ok()) {
    // Another process holding RocksDB's own LOCK is not damage: never wipe
    // then. RocksDB reports it only as an IOError naming the lock.
    if (absl::IsUnavailable(opened) &&
        absl::StrContains(opened.message(), "lock")) {
      return absl::FailedPreconditionError(
          absl::StrCat("row cache: ", path, " is locked: ", opened.message()));
    }
    LOG(WARNING) << "row cache " << path << ": cannot open the database ("
                 << opened << "); deleting and rebuilding it";
    RETURN_IF_ERROR(cache->CreateFresh());
    cache->outcome_ = RocksDbOpenOutcome::kRebuiltCorrupt;
    return cache;
  }

  std::string stored;
  const rocksdb::Status got = cache->db_->Get(
      rocksdb::ReadOptions(), cache->meta_cf_, kIdentityKey, &stored);
  const std::string identity = cache->Identity();
  if (got.ok() && stored == identity) {
    cache->outcome_ = RocksDbOpenOutcome::kReopened;
    return cache;
  }
  if (got.ok()) {
    LOG(WARNING) << "row cache " << path << ": stored identity \"" << stored
                 << "\" != \"" << identity << "\"; deleting and rebuilding it";
    cache->outcome_ = RocksDbOpenOutcome::kRebuiltSourceChanged;
  } else {
    // Every database this class creates has the record: one without it is
    // damaged (e.g. a truncated MANIFEST lost the last edits) or foreign.
    LOG(WARNING) << "row cache " << path << ": no readable identity record ("
                 << got.ToString() << "); deleting and rebuilding it";
    cache->outcome_ = RocksDbOpenOutcome::kRebuiltCorrupt;
  }
  RETURN_IF_ERROR(cache->CreateFresh());
  return cache;
}

RocksDbRowCache::RocksDbRowCache(const RocksDbRowCacheOptions& options,
                                 int lock_fd)
    : options_(options),
      lock_fd_(lock_fd),
      block_cache_(rocksdb::NewLRUCache(options.block_cache_bytes)) {}

RocksDbRowCache::~RocksDbRowCache() {
  CloseDb();
  ::close(lock_fd_);  // Releases the flock.
}

std::string RocksDbRowCache::Identity() const {
  return absl::StrCat("mneme-row-cache/", kLayoutVersion,
                      ";row_bytes=", options_.row_bytes,
                      ";source=", options_.source_id);
}

absl::Status RocksDbRowCache::OpenDb() {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.paranoid_checks = true;
  db_options.max_background_jobs = 2;
  db_options.max_manifest_file_size = kManifestMaxBytes;
  db_options.max_log_file_size = kInfoLogMaxBytes;
  db_options.keep_log_file_num = kInfoLogFilesKept;
  db_options.use_direct_reads = options_.direct_reads;
  // Memtables (WAL disabled) are flushed on close.
  db_options.avoid_flush_during_shutdown = false;

  rocksdb::BlockBasedTableOptions table;
  table.block_cache = block_cache_;
  table.checksum = rocksdb::kXXH3;
  table.block_size = 4096;
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  if (options_.bloom_bits_per_key > 0) {
    table.filter_policy.reset(
        rocksdb::NewBloomFilterPolicy(options_.bloom_bits_per_key));
  }

  rocksdb::ColumnFamilyOptions meta;
  meta.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  meta.write_buffer_size = size_t{64} * 1024;

  rocksdb::ColumnFamilyOptions rows;
  rows.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Quantized rows do not compress; compressing would only cost CPU.
  rows.compression = rocksdb::kNoCompression;
  rows.write_buffer_size = options_.write_buffer_bytes;
  rows.max_write_buffer_number = 2;
  rows.compaction_style = rocksdb::kCompactionStyleFIFO;
  rows.compaction_options_fifo.max_table_files_size =
      options_.budget_bytes - kMiscReserveBytes -
      2 * options_.write_buffer_bytes;
  rows.compaction_options_fifo.allow_compaction = false;
  rows.ttl = 0;
  rows.periodic_compaction_seconds = 0;
  // All files are L0 and in FIFO "bottommost": filters must stay on.
  rows.optimize_filters_for_hits = false;

  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, meta}, {kRowsColumnFamily, rows}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s =
      rocksdb::DB::Open(db_options, options_.path, families, &handles, &db);
  if (!s.ok()) {
    return FromRocks(s, "open");
  }
  db_.reset(db);
  meta_cf_ = handles[0];
  rows_cf_ = handles[1];
  return absl::OkStatus();
}

void RocksDbRowCache::CloseDb() {
  if (db_ == nullptr) {
    return;
  }
  for (rocksdb::ColumnFamilyHandle* h : {meta_cf_, rows_cf_}) {
    if (h == nullptr) {
      continue;
    }
    const rocksdb::Status s = db_->DestroyColumnFamilyHandle(h);
    if (!s.ok()) {
      LOG(WARNING) << "row cache: " << s.ToString();
    }
  }
  meta_cf_ = rows_cf_ = nullptr;
  const rocksdb::Status s = db_->Close();
  if (!s.ok()) {
    LOG(WARNING) << "row cache " << options_.path
                 << ": close: " << s.ToString();
  }
  db_.reset();
}

absl::Status RocksDbRowCache::Wipe() {
  std::error_code ec;
  std::vector<fs::path> victims;
  for (fs::directory_iterator it(options_.path, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().filename() != kLockFileName) {
      victims.push_back(it->path());
    }
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "row cache: cannot list ", options_.path, ": ", ec.message()));
  }
  for (const fs::path& p : victims) {
    fs::remove_all(p, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "row cache: cannot delete ", p.string(), ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status RocksDbRowCache::CreateFresh() {
  CloseDb();
  absl::Status s = Wipe();
  if (!s.ok()) {
    return s;
  }
  s = OpenDb();
  if (!s.ok()) {
    return s;
  }
  rocksdb::WriteOptions write;
  write.disableWAL = true;
  rocksdb::Status rs = db_->Put(write, meta_cf_, kIdentityKey, Identity());
  if (rs.ok()) {
    rs = db_->Flush(rocksdb::FlushOptions(), meta_cf_);
  }
  return FromRocks(rs, "writing the identity record");
}

absl::StatusOr<size_t> RocksDbRowCache::LookupBatch(
    uint32_t table, absl::Span<const int64_t> ids, absl::Span<uint8_t> dst,
    std::vector<bool>* hits) {
  if (hits == nullptr) {
    return absl::InvalidArgumentError("row cache: hits is null");
  }
  RETURN_IF_ERROR(
      ValidateRowCacheArgs(table, ids, dst.size(), options_.row_bytes));
  const size_t n = ids.size();
  hits->assign(n, false);
  if (n == 0) {
    return 0;
  }

  std::vector<char> key_bytes(n * kKeyBytes);
  std::vector<rocksdb::Slice> keys(n);
  for (size_t i = 0; i < n; ++i) {
    EncodeKey(table, ids[i], &key_bytes[i * kKeyBytes]);
    keys[i] = rocksdb::Slice(&key_bytes[i * kKeyBytes], kKeyBytes);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  rocksdb::ReadOptions read;
  read.verify_checksums = true;
  db_->MultiGet(read, rows_cf_, n, keys.data(), values.data(), statuses.data());

  size_t found = 0;
  uint64_t corrupt = 0;
  uint64_t errors = 0;
  for (size_t i = 0; i < n; ++i) {
    const rocksdb::Status& s = statuses[i];
    if (s.ok()) {
      if (values[i].size() != options_.row_bytes) {
        ++corrupt;
        continue;
      }
      std::memcpy(dst.data() + i * options_.row_bytes, values[i].data(),
                  options_.row_bytes);
      (*hits)[i] = true;
      ++found;
    } else if (s.IsNotFound()) {
      continue;
    } else if (s.IsCorruption()) {
      ++corrupt;
    } else {
      ++errors;
    }
  }
  if (corrupt > 0 || errors > 0) {
    LOG_EVERY_N(WARNING, 1000) << "row cache " << options_.path << ": "
                               << corrupt << " corrupt rows and " << errors
                               << " read errors in a batch (served as misses)";
    corrupt_rows_.fetch_add(corrupt, std::memory_order_relaxed);
    read_errors_.fetch_add(errors, std::memory_order_relaxed);
  }
  hits_.fetch_add(found, std::memory_order_relaxed);
  misses_.fetch_add(n - found, std::memory_order_relaxed);
  return found;
}

absl::Status RocksDbRowCache::InsertBatch(uint32_t table,
                                          absl::Span<const int64_t> ids,
                                          absl::Span<const uint8_t> rows) {
  RETURN_IF_ERROR(
      ValidateRowCacheArgs(table, ids, rows.size(), options_.row_bytes));
  if (ids.empty()) {
    return absl::OkStatus();
  }
  rocksdb::WriteBatch batch(ids.size() * (kKeyBytes + options_.row_bytes + 16));
  char key[kKeyBytes];
  for (size_t i = 0; i < ids.size(); ++i) {
    EncodeKey(table, ids[i], key);
    const rocksdb::Status s =
        batch.Put(rows_cf_, rocksdb::Slice(key, kKeyBytes),
                  rocksdb::Slice(reinterpret_cast<const char*>(rows.data()) +
                                     i * options_.row_bytes,
                                 options_.row_bytes));
    if (!s.ok()) {
      return FromRocks(s, "row cache: building a write batch");
    }
  }
  rocksdb::WriteOptions write;
  write.disableWAL = true;
  write.no_slowdown = true;
  const rocksdb::Status s = db_->Write(write, &batch);
  if (s.IsIncomplete()) {
    dropped_inserts_.fetch_add(ids.size(), std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (!s.ok()) {
    return FromRocks(s, "row cache: write");
  }
  inserts_.fetch_add(ids.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

RowCacheStats RocksDbRowCache::GetStats() const {
  RowCacheStats stats;
  stats.hits = hits_.load(std::memory_order_relaxed);
  stats.misses = misses_.load(std::memory_order_relaxed);
  stats.lookups = stats.hits + stats.misses;
  stats.inserts = inserts_.load(std::memory_order_relaxed);
  stats.corrupt_rows = corrupt_rows_.load(std::memory_order_relaxed);
  stats.read_errors = read_errors_.load(std::memory_order_relaxed);
  stats.dropped_inserts = dropped_inserts_.load(std::memory_order_relaxed);
  stats.budget_bytes = options_.budget_bytes;
  uint64_t value = 0;
  for (rocksdb::ColumnFamilyHandle* h : {meta_cf_, rows_cf_}) {
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize,
                            &value)) {
      stats.bytes_in_use += value;
    }
  }
  if (db_->GetIntProperty(rows_cf_, rocksdb::DB::Properties::kEstimateNumKeys,
                          &value)) {
    stats.entries = value;
  }
  return stats;
}

}  // namespace mneme::engram
