#include "engram_store/engram_store.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engram_store/cache/source_fingerprint.h"
#include "engram_store/io/pread_pool_reader.h"
#include "engram_store/io/uring_row_reader.h"
#include "formats/row_decode.h"
#include "glog/logging.h"

namespace mneme::engram {

size_t EncodedRowBytes(RowEncoding encoding, formats::RowFormat format) {
  switch (encoding) {
    case RowEncoding::kRaw:
      return formats::RowBytes(format);
    case RowEncoding::kBf16:
      return formats::kRowDim * sizeof(uint16_t);
    case RowEncoding::kFp32:
      return formats::kRowDim * sizeof(float);
  }
  return 0;
}

// The store's Prometheus series (all optional: null without a registry).
struct EngramStore::Metrics {
  Counter* lookups = nullptr;
  Counter* rows_requested = nullptr;
  Counter* rows_by_tier[4] = {};  // ram, rocksdb, local, source
  Counter* bytes_read_local = nullptr;
  Counter* bytes_read_source = nullptr;
  Counter* errors = nullptr;
  Histogram* lookup_seconds = nullptr;
  Histogram* read_seconds = nullptr;
};

namespace {

enum Tier { kRamTier = 0, kRocksDbTier = 1, kLocalTier = 2, kSourceTier = 3 };
constexpr const char* kTierNames[] = {"ram", "rocksdb", "local", "source"};

void Inc(Counter* counter, double n = 1) {
  if (counter != nullptr) counter->Increment(n);
}

}  // namespace

absl::Status ValidateEngramStoreOptions(const EngramStoreOptions& o) {
  if (o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint is required");
  }
  if (o.tp_size < 1 || o.tp_size > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size=", o.tp_size, " must be in [1, 64]"));
  }
  if (o.ranks.empty()) {
    return absl::InvalidArgumentError("ranks must name at least one rank");
  }
  for (int rank : o.ranks) {
    if (rank < 0 || rank >= o.tp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " outside [0, tp_size=", o.tp_size, ")"));
    }
  }
  if (o.io_threads < 1 || o.io_threads > 1024) {
    return absl::InvalidArgumentError("io_threads must be in [1, 1024]");
  }
  if (o.prefetch_queue_rows < 0) {
    return absl::InvalidArgumentError("prefetch_queue_rows must be >= 0");
  }
  if (o.prefetch_threads < 0 || o.prefetch_threads > 64) {
    return absl::InvalidArgumentError("prefetch_threads must be in [0, 64]");
  }
  for (size_t i = 1; i < o.ranks.size(); ++i) {
    if (o.ranks[i] <= o.ranks[i - 1]) {
      return absl::InvalidArgumentError("ranks must be ascending and distinct");
    }
  }
  return absl::OkStatus();
}

EngramStore::EngramStore(const EngramStoreOptions& options)
    : options_(options) {}

EngramStore::~EngramStore() {
  {
    absl::MutexLock lock(&prefetch_mu_);
    stopping_ = true;
  }
  for (std::thread& t : prefetch_threads_) t.join();
}

absl::StatusOr<std::unique_ptr<EngramStore>> EngramStore::Create(
    const EngramStoreOptions& options, MetricsRegistry* metrics,
    std::unique_ptr<RowReader> reader) {
  RETURN_IF_ERROR(ValidateEngramStoreOptions(options));
  auto store = std::unique_ptr<EngramStore>(new EngramStore(options));

  ASSIGN_OR_RETURN(store->checkpoint_,
                   EngramCheckpoint::Open(options.checkpoint_dir));
  const EngramCheckpoint& c = *store->checkpoint_;

  // Rows this store serves: the union of its ranks' column ranges.
  std::vector<bool> column_served(c.hasher().num_columns(), false);
  store->served_.resize(c.tables().size());
  for (int rank : options.ranks) {
    ASSIGN_OR_RETURN(
        RankAssignment assignment,
        AssignRank(c.hasher().layout(), options.split, options.tp_size, rank));
    for (int column : assignment.columns) column_served[column] = true;
    for (size_t t = 0; t < c.tables().size(); ++t) {
      const auto& rows = assignment.layers[t].column_rows;
      store->served_[t].insert(store->served_[t].end(), rows.begin(),
                               rows.end());
    }
  }
  for (size_t col = 0; col < column_served.size(); ++col) {
    if (column_served[col]) store->columns_.push_back(static_cast<int>(col));
  }
  for (auto& ranges : store->served_) ranges = CoalesceRowRanges(ranges);

  if (!options.local_copy_dir.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<LocalCopy> local,
                     LocalCopy::Open(options.local_copy_dir, c,
                                     LocalCopyTarget{.tp_size = options.tp_size,
                                                     .ranks = options.ranks,
                                                     .split = options.split}));
    store->local_copy_ = std::move(local);
  }

  for (const checkpoint::EngramTableLocation& location : c.tables()) {
    Table table;
    table.location = &location;
    ASSIGN_OR_RETURN(
        std::unique_ptr<RowFile> weights,
        RowFile::Open(location.shard_path, options.source_open_mode));
    table.weight_file = std::move(weights);
    if (location.scale_shard_path != location.shard_path) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<RowFile> scales,
          RowFile::Open(location.scale_shard_path, options.source_open_mode));
      table.scale_file = std::move(scales);
    }
    if (store->local_copy_ != nullptr) {
      ASSIGN_OR_RETURN(std::string path,
                       store->local_copy_->DataPath(location.layer));
      ASSIGN_OR_RETURN(std::unique_ptr<RowFile> local,
                       RowFile::Open(path, options.local_open_mode));
      table.local_file = std::move(local);
    }
    store->tables_.push_back(std::move(table));
  }

  const formats::RowFormat format = c.config().format;
  if (options.ram_cache_bytes > 0) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<RamRowCache> ram,
        RamRowCache::Create({.row_bytes = formats::RowBytes(format),
                             .budget_bytes = options.ram_cache_bytes}));
    store->ram_cache_ = std::move(ram);
  }
  if (!options.rocksdb_dir.empty()) {
    std::vector<std::string> shards;
    for (const checkpoint::EngramTableLocation& t : c.tables()) {
      shards.push_back(t.shard_path);
      if (t.scale_shard_path != t.shard_path) {
        shards.push_back(t.scale_shard_path);
      }
    }
    ASSIGN_OR_RETURN(std::string fingerprint, SourceFingerprint(shards));
    ASSIGN_OR_RETURN(
        std::unique_ptr<RocksDbRowCache> rocksdb,
        RocksDbRowCache::Create(
            {.path = options.rocksdb_dir,
             .source_id =
                 absl::StrCat(fingerprint, "|", formats::RowFormatName(format)),
             .row_bytes = formats::RowBytes(format),
             .budget_bytes = options.rocksdb_budget_bytes,
             .write_buffer_bytes = options.rocksdb_write_buffer_bytes}));
    store->rocksdb_ = std::move(rocksdb);
  }

  if (reader != nullptr) {
    store->reader_ = std::move(reader);
  } else if (options.io_backend == IoBackend::kUring) {
    UringRowReaderOptions uring_options;
    uring_options.rings = options.io_threads;
    ASSIGN_OR_RETURN(std::unique_ptr<UringRowReader> uring,
                     UringRowReader::Create(uring_options));
    store->reader_ = std::move(uring);
  } else {
    PreadPoolReaderOptions pool_options;
    pool_options.threads = options.io_threads;
    ASSIGN_OR_RETURN(std::unique_ptr<PreadPoolReader> pool,
                     PreadPoolReader::Create(pool_options));
    store->reader_ = std::move(pool);
  }

  store->metrics_ = std::make_unique<Metrics>();
  if (metrics != nullptr) {
    Metrics& m = *store->metrics_;
    auto counter = [&](const std::string& name, const std::string& help,
                       std::vector<std::string> labels = {})
        -> absl::StatusOr<CounterFamily*> {
      return metrics->AddCounter(
          {.name = name, .help = help, .label_names = std::move(labels)});
    };
    absl::StatusOr<CounterFamily*> lookups =
        counter("mneme_engram_lookups_total", "Lookup calls.");
    absl::StatusOr<CounterFamily*> rows =
        counter("mneme_engram_rows_requested_total", "Row ids requested.");
    absl::StatusOr<CounterFamily*> tiers =
        counter("mneme_engram_rows_served_total",
                "Unique rows by the tier that served them.", {"tier"});
    absl::StatusOr<CounterFamily*> bytes = counter(
        "mneme_engram_bytes_read_total", "Bytes read from disk.", {"source"});
    absl::StatusOr<CounterFamily*> errors =
        counter("mneme_engram_lookup_errors_total", "Failed lookups.");
    absl::StatusOr<HistogramFamily*> lookup_seconds = metrics->AddHistogram(
        {.name = "mneme_engram_lookup_seconds",
         .help = "Lookup latency, from call to rows in the output."},
        ExponentialBuckets(1e-5, 2, 20));
    absl::StatusOr<HistogramFamily*> read_seconds =
        metrics->AddHistogram({.name = "mneme_engram_read_seconds",
                               .help = "Latency of one batch read from disk."},
                              ExponentialBuckets(1e-5, 2, 20));
    for (const absl::Status& s :
         {lookups.status(), rows.status(), tiers.status(), bytes.status(),
          errors.status(), lookup_seconds.status(), read_seconds.status()}) {
      RETURN_IF_ERROR(s);
    }
    m.lookups = *(*lookups)->Get();
    m.rows_requested = *(*rows)->Get();
    for (int tier = 0; tier < 4; ++tier) {
      m.rows_by_tier[tier] = *(*tiers)->Get({kTierNames[tier]});
    }
    m.bytes_read_local = *(*bytes)->Get({"local"});
    m.bytes_read_source = *(*bytes)->Get({"checkpoint"});
    m.errors = *(*errors)->Get();
    m.lookup_seconds = *(*lookup_seconds)->Get();
    m.read_seconds = *(*read_seconds)->Get();
    EngramStore* self = store.get();
    const std::vector<std::pair<std::string, std::function<double()>>> gauges =
        {{"mneme_engram_ram_cache_bytes",
          [self] {
            return self->ram_cache_
                       ? static_cast<double>(
                             self->ram_cache_->GetStats().bytes_in_use)
                       : 0.0;
          }},
         {"mneme_engram_ram_cache_budget_bytes",
          [self] {
            return static_cast<double>(self->options_.ram_cache_bytes);
          }},
         {"mneme_engram_rocksdb_bytes",
          [self] {
            return self->rocksdb_ ? static_cast<double>(
                                        self->rocksdb_->GetStats().bytes_in_use)
                                  : 0.0;
          }},
         {"mneme_engram_prefetch_queue_rows", [self] {
            return static_cast<double>(self->GetStats().prefetch_queued);
          }}};
    for (const auto& [name, callback] : gauges) {
      if (absl::Status s = metrics->AddCallbackGauge(
              {.name = name, .help = "Engram store gauge (see docs)."},
              callback);
          !s.ok()) {
        return s;
      }
    }
  }

  for (int i = 0; i < options.prefetch_threads; ++i) {
    store->prefetch_threads_.emplace_back(
        [s = store.get()] { s->PrefetchLoop(); });
  }
  return store;
}

absl::StatusOr<size_t> EngramStore::TableIndex(int layer) const {
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].location->layer == layer) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", layer, " has no Engram table (Engram layers: ",
                   absl::StrJoin(checkpoint_->config().layer_ids, ", "), ")"));
}

bool EngramStore::Serves(int layer, int64_t id) const {
  absl::StatusOr<size_t> t = TableIndex(layer);
  if (!t.ok()) return false;
  const std::vector<RowRange>& ranges = served_[*t];
  auto it = std::upper_bound(
      ranges.begin(), ranges.end(), id,
      [](int64_t v, const RowRange& r) { return v < r.begin; });
  return it != ranges.begin() && id < std::prev(it)->end;
}

absl::Status EngramStore::Lookup(int layer, absl::Span<const int64_t> ids,
                                 RowEncoding encoding, absl::Span<uint8_t> out,
                                 absl::Time deadline) {
  const absl::Time start = absl::Now();
  lookups_.fetch_add(1, std::memory_order_relaxed);
  rows_requested_.fetch_add(ids.size(), std::memory_order_relaxed);
  Inc(metrics_->lookups);
  Inc(metrics_->rows_requested, static_cast<double>(ids.size()));
  ASSIGN_OR_RETURN(size_t table_index, TableIndex(layer));
  const checkpoint::EngramTableLocation& location =
      *tables_[table_index].location;
  const size_t out_row_bytes = EncodedRowBytes(encoding, location.format);
  if (out.size() != ids.size() * out_row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("output holds ", out.size(), " bytes; ", ids.size(),
                     " rows need ", ids.size() * out_row_bytes));
  }
  // Validate, then deduplicate (first occurrence order).
  absl::flat_hash_map<int64_t, uint32_t> slot_of;
  slot_of.reserve(ids.size());
  std::vector<int64_t> unique;
  std::vector<uint32_t> slots(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= location.rows) {
      return absl::OutOfRangeError(
          absl::StrCat("row id ", id, " outside layer ", layer, "'s table [0, ",
                       location.rows, ")"));
    }
    auto [it, inserted] =
        slot_of.emplace(id, static_cast<uint32_t>(unique.size()));
    if (inserted) {
      if (!Serves(layer, id)) {
        return absl::OutOfRangeError(
            absl::StrCat("row id ", id, " of layer ", layer,
                         " is not served by this store (tp ", options_.tp_size,
                         ", ranks ", absl::StrJoin(options_.ranks, ","), ", ",
                         ColumnSplitName(options_.split), " split)"));
      }
      unique.push_back(id);
    }
    slots[i] = it->second;
  }
  rows_unique_.fetch_add(unique.size(), std::memory_order_relaxed);

  const size_t row_bytes = formats::RowBytes(location.format);
  std::vector<uint8_t> raw(unique.size() * row_bytes);
  if (absl::Status s =
          FetchUnique(table_index, unique, absl::MakeSpan(raw), deadline);
      !s.ok()) {
    Inc(metrics_->errors);
    return s;
  }

  // Scatter into request order, decoding as asked.
  if (encoding == RowEncoding::kRaw) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(out.data() + i * row_bytes,
                  raw.data() + size_t{slots[i]} * row_bytes, row_bytes);
    }
  } else {
    const formats::RowDecodeOptions decode{
        .format = location.format, .global_scale = location.global_scale};
    std::vector<uint8_t> decoded(unique.size() * out_row_bytes);
    RETURN_IF_ERROR(
        encoding == RowEncoding::kBf16
            ? formats::DecodeRowsBf16(
                  decode, raw,
                  absl::MakeSpan(reinterpret_cast<uint16_t*>(decoded.data()),
                                 unique.size() * formats::kRowDim))
            : formats::DecodeRowsF32(
                  decode, raw,
                  absl::MakeSpan(reinterpret_cast<float*>(decoded.data()),
                                 unique.size() * formats::kRowDim)));
    for (size_t i = 0; i < ids.size(); ++i) {
      std::memcpy(out.data() + i * out_row_bytes,
                  decoded.data() + size_t{slots[i]} * out_row_bytes,
                  out_row_bytes);
    }
  }
  if (metrics_->lookup_seconds != nullptr) {
    metrics_->lookup_seconds->Observe(
        absl::ToDoubleSeconds(absl::Now() - start));
  }
  return absl::OkStatus();
}

absl::Status EngramStore::FetchUnique(size_t table,
                                      absl::Span<const int64_t> ids,
                                      absl::Span<uint8_t> out,
                                      absl::Time deadline) {
  const uint32_t table_id =
      static_cast<uint32_t>(tables_[table].location->layer);
  const size_t row_bytes = formats::RowBytes(tables_[table].location->format);
  std::vector<size_t> missing(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) missing[i] = i;

  // Tiers in order; each shrinks `missing`.
  RowCache* tiers[] = {ram_cache_.get(), rocksdb_.get()};
  std::vector<std::vector<size_t>> filled_by(2);
  for (int tier = 0; tier < 2 && !missing.empty(); ++tier) {
    RowCache* cache = tiers[tier];
    if (cache == nullptr) continue;
    std::vector<int64_t> miss_ids;
    miss_ids.reserve(missing.size());
    for (size_t i : missing) miss_ids.push_back(ids[i]);
    std::vector<uint8_t> rows(miss_ids.size() * row_bytes);
    std::vector<bool> hits;
    RETURN_IF_ERROR(
        cache->LookupBatch(table_id, miss_ids, absl::MakeSpan(rows), &hits)
            .status());
    std::vector<size_t> still;
    for (size_t k = 0; k < missing.size(); ++k) {
      if (hits[k]) {
        std::memcpy(out.data() + missing[k] * row_bytes,
                    rows.data() + k * row_bytes, row_bytes);
        filled_by[tier].push_back(missing[k]);
      } else {
        still.push_back(missing[k]);
      }
    }
    missing.swap(still);
  }
  ram_hits_.fetch_add(filled_by[0].size(), std::memory_order_relaxed);
  rocksdb_hits_.fetch_add(filled_by[1].size(), std::memory_order_relaxed);
  Inc(metrics_->rows_by_tier[kRamTier],
      static_cast<double>(filled_by[0].size()));
  Inc(metrics_->rows_by_tier[kRocksDbTier],
      static_cast<double>(filled_by[1].size()));

  if (!missing.empty()) {
    std::vector<int64_t> miss_ids;
    miss_ids.reserve(missing.size());
    for (size_t i : missing) miss_ids.push_back(ids[i]);
    std::vector<uint8_t> rows(miss_ids.size() * row_bytes);
    if (absl::Status s = ReadRows(table, miss_ids, absl::MakeSpan(rows),
                                  deadline, local_copy_ != nullptr);
        !s.ok()) {
      return s;
    }
    for (size_t k = 0; k < missing.size(); ++k) {
      std::memcpy(out.data() + missing[k] * row_bytes,
                  rows.data() + k * row_bytes, row_bytes);
    }
    // Fill the tiers the rows passed (read-through). A failed insert only
    // costs a future miss.
    if (rocksdb_ != nullptr) {
      if (absl::Status s = rocksdb_->InsertBatch(table_id, miss_ids, rows);
          !s.ok()) {
        LOG_EVERY_N(WARNING, 1000) << "RocksDB tier insert failed: " << s;
      }
    }
    if (ram_cache_ != nullptr) {
      (void)ram_cache_->InsertBatch(table_id, miss_ids, rows);
    }
  }
  // Rows found only in the RocksDB tier go to the RAM cache too.
  if (ram_cache_ != nullptr && !filled_by[1].empty()) {
    std::vector<int64_t> promote_ids;
    std::vector<uint8_t> promote_rows;
    for (size_t i : filled_by[1]) {
      promote_ids.push_back(ids[i]);
      promote_rows.insert(promote_rows.end(), out.begin() + i * row_bytes,
                          out.begin() + (i + 1) * row_bytes);
    }
    (void)ram_cache_->InsertBatch(table_id, promote_ids, promote_rows);
  }
  return absl::OkStatus();
}

absl::Status EngramStore::ReadRows(size_t table, absl::Span<const int64_t> ids,
                                   absl::Span<uint8_t> out, absl::Time deadline,
                                   bool use_local) {
  const Table& t = tables_[table];
  const checkpoint::EngramTableLocation& loc = *t.location;
  const size_t row_bytes = loc.weight_row_bytes + loc.scale_row_bytes;
  std::vector<ReadSpan> spans;
  spans.reserve(ids.size() * 2);
  std::vector<size_t> local_rows, source_rows;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint8_t* dest = out.data() + i * row_bytes;
    std::optional<uint64_t> local_offset;
    if (use_local) local_offset = local_copy_->Locate(loc.layer, ids[i]);
    if (local_offset.has_value()) {
      spans.push_back({t.local_file.get(), *local_offset, row_bytes, dest});
      local_rows.push_back(i);
      continue;
    }
    const uint64_t id = static_cast<uint64_t>(ids[i]);
    spans.push_back({t.weight_file.get(),
                     loc.weight_offset + id * loc.weight_row_bytes,
                     loc.weight_row_bytes, dest});
    spans.push_back(
        {t.scale_file != nullptr ? t.scale_file.get() : t.weight_file.get(),
         loc.scale_offset + id * loc.scale_row_bytes, loc.scale_row_bytes,
         dest + loc.weight_row_bytes});
    source_rows.push_back(i);
  }
  const absl::Time start = absl::Now();
  absl::Status status = reader_->Read(spans, deadline);
  if (metrics_->read_seconds != nullptr) {
    metrics_->read_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (!status.ok() && !local_rows.empty() &&
      status.code() != absl::StatusCode::kDeadlineExceeded) {
    // The local copy failed (truncated, EIO): read everything from the
    // checkpoint instead, which is the source of truth.
    LOG_EVERY_N(WARNING, 100) << "local copy read failed, falling back to "
                                 "the checkpoint: "
                              << status;
    local_fallbacks_.fetch_add(local_rows.size(), std::memory_order_relaxed);
    return ReadRows(table, ids, out, deadline, /*use_local=*/false);
  }
  RETURN_IF_ERROR(status);
  local_rows_.fetch_add(local_rows.size(), std::memory_order_relaxed);
  source_rows_.fetch_add(source_rows.size(), std::memory_order_relaxed);
  Inc(metrics_->rows_by_tier[kLocalTier],
      static_cast<double>(local_rows.size()));
  Inc(metrics_->rows_by_tier[kSourceTier],
      static_cast<double>(source_rows.size()));
  Inc(metrics_->bytes_read_local,
      static_cast<double>(local_rows.size() * row_bytes));
  Inc(metrics_->bytes_read_source,
      static_cast<double>(source_rows.size() * row_bytes));
  return absl::OkStatus();
}

int64_t EngramStore::Prefetch(int layer, absl::Span<const int64_t> ids) {
  absl::StatusOr<size_t> t = TableIndex(layer);
  if (!t.ok() || ids.empty() || options_.prefetch_threads == 0) return 0;
  PrefetchItem item{layer, {}};
  const int64_t rows = tables_[*t].location->rows;
  for (int64_t id : ids) {
    if (id >= 0 && id < rows && Serves(layer, id)) item.ids.push_back(id);
  }
  std::sort(item.ids.begin(), item.ids.end());
  item.ids.erase(std::unique(item.ids.begin(), item.ids.end()), item.ids.end());
  const int64_t n = static_cast<int64_t>(item.ids.size());
  if (n == 0) return 0;
  absl::MutexLock lock(&prefetch_mu_);
  if (stopping_ || prefetch_queued_rows_ + n > options_.prefetch_queue_rows) {
    prefetch_dropped_.fetch_add(n, std::memory_order_relaxed);
    return 0;
  }
  prefetch_queued_rows_ += n;
  prefetch_queue_.push_back(std::move(item));
  prefetch_accepted_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

absl::StatusOr<int64_t> EngramStore::PrefetchTokens(
    int layer, absl::Span<const int64_t> context,
    absl::Span<const int64_t> tokens) {
  if (absl::StatusOr<size_t> t = TableIndex(layer); !t.ok()) {
    return t.status();
  }
  std::vector<int64_t> ids(tokens.size() * columns_.size());
  if (absl::Status s = checkpoint_->hasher().ComputeColumnRowIds(
          layer, std::span<const int64_t>(context.data(), context.size()),
          std::span<const int64_t>(tokens.data(), tokens.size()), columns_,
          ids);
      !s.ok()) {
    return s;
  }
  return Prefetch(layer, ids);
}

void EngramStore::PrefetchLoop() {
  while (true) {
    PrefetchItem item;
    {
      absl::MutexLock lock(&prefetch_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(prefetch_mu_) {
        return stopping_ || !prefetch_queue_.empty();
      };
      prefetch_mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      item = std::move(prefetch_queue_.front());
      prefetch_queue_.pop_front();
      prefetch_queued_rows_ -= static_cast<int64_t>(item.ids.size());
    }
    absl::StatusOr<size_t> t = TableIndex(item.layer);
    if (!t.ok()) continue;
    std::vector<uint8_t> scratch(
        item.ids.size() * formats::RowBytes(tables_[*t].location->format));
    const absl::Status s = FetchUnique(*t, item.ids, absl::MakeSpan(scratch),
                                       absl::Now() + options_.prefetch_timeout);
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 100) << "prefetch failed: " << s;
    }
  }
}

EngramStoreStats EngramStore::GetStats() const {
  EngramStoreStats s;
  s.lookups = lookups_.load();
  s.rows_requested = rows_requested_.load();
  s.rows_unique = rows_unique_.load();
  s.ram_hits = ram_hits_.load();
  s.rocksdb_hits = rocksdb_hits_.load();
  s.local_rows = local_rows_.load();
  s.source_rows = source_rows_.load();
  s.local_fallbacks = local_fallbacks_.load();
  s.prefetch_accepted = prefetch_accepted_.load();
  s.prefetch_dropped = prefetch_dropped_.load();
  {
    absl::MutexLock lock(&prefetch_mu_);
    s.prefetch_queued = static_cast<uint64_t>(prefetch_queued_rows_);
  }
  return s;
}

}  // namespace mneme::engram
