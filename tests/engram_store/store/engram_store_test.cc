#include "engram_store/engram_store.h"

#include <dirent.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "engram_store/io/pread_pool_reader.h"
#include "engram_store/local_copy/local_copy_writer.h"
#include "formats/row_decode.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/fault_injecting_row_reader.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram {
namespace {

namespace fs = std::filesystem;
using testing::FaultInjectingRowReader;
using testing::FaultRule;
using testing::ReadFault;

// Synthetic checkpoints, made once per format for the whole test binary.
const std::string& Checkpoint(formats::RowFormat format) {
  static auto* dirs = new std::map<formats::RowFormat, std::string>();
  auto it = dirs->find(format);
  if (it != dirs->end()) return it->second;
  synthetic::SyntheticCheckpointOptions options;
  options.out_dir = mneme::testing::MakeTempDir("store") + "/ckpt";
  options.engram_format = format;
  options.seed = 21;
  options.threads = 2;
  EXPECT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
  return (*dirs)[format] = options.out_dir;
}

int ThreadCount() {
  int n = 0;
  DIR* dir = opendir("/proc/self/task");
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

FaultRule Rule(ReadFault fault, int times) {
  FaultRule rule;
  rule.fault = fault;
  rule.times = times;
  return rule;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// Ids served by `store` in table `t`: every range's first and last row,
// random rows inside ranges, and duplicates.
std::vector<int64_t> ServedIds(const EngramStore& store, size_t t, int n,
                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids;
  const auto& ranges = store.served_ranges()[t];
  for (const RowRange& r : ranges) {
    ids.push_back(r.begin);
    ids.push_back(r.end - 1);
  }
  for (int i = 0; i < n; ++i) {
    const RowRange& r = ranges[rng() % ranges.size()];
    ids.push_back(r.begin + static_cast<int64_t>(rng() % r.size()));
  }
  // Duplicates, and rows sharing pages with their neighbours.
  for (int i = 0; i < n / 4; ++i) ids.push_back(ids[rng() % ids.size()]);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// The reference: direct reads of the checkpoint, decoded by the format
// library.
std::vector<uint8_t> Expected(const EngramCheckpoint& c, int layer,
                              const std::vector<int64_t>& ids,
                              RowEncoding encoding) {
  const checkpoint::EngramTableLocation& t = **c.Table(layer);
  std::vector<uint8_t> raw(ids.size() * formats::RowBytes(t.format));
  EXPECT_TRUE(c.ReadRawRows(layer, ids, absl::MakeSpan(raw)).ok());
  if (encoding == RowEncoding::kRaw) return raw;
  std::vector<uint8_t> out(ids.size() * EncodedRowBytes(encoding, t.format));
  const formats::RowDecodeOptions decode{.format = t.format,
                                         .global_scale = t.global_scale};
  if (encoding == RowEncoding::kBf16) {
    EXPECT_TRUE(formats::DecodeRowsBf16(
                    decode, raw,
                    absl::MakeSpan(reinterpret_cast<uint16_t*>(out.data()),
                                   ids.size() * formats::kRowDim))
                    .ok());
  } else {
    EXPECT_TRUE(formats::DecodeRowsF32(
                    decode, raw,
                    absl::MakeSpan(reinterpret_cast<float*>(out.data()),
                                   ids.size() * formats::kRowDim))
                    .ok());
  }
  return out;
}

std::vector<uint8_t> Lookup(EngramStore& store, int layer,
                            const std::vector<int64_t>& ids,
                            RowEncoding encoding, absl::Status* status) {
  const formats::RowFormat format = store.checkpoint().config().format;
  std::vector<uint8_t> out(ids.size() * EncodedRowBytes(encoding, format));
  *status = store.Lookup(layer, ids, encoding, absl::MakeSpan(out), Soon());
  return out;
}

struct StoreCase {
  std::string name;
  formats::RowFormat format = formats::RowFormat::kFp8;
  IoBackend io = IoBackend::kPread;
  OpenMode mode = OpenMode::kBuffered;
  bool ram = true;
  bool rocksdb = false;
  bool local_copy = false;
  int tp = 1;
};

void PrintTo(const StoreCase& c, std::ostream* os) { *os << c.name; }

class EngramStoreTest : public ::testing::TestWithParam<StoreCase> {
 protected:
  absl::StatusOr<std::unique_ptr<EngramStore>> Open(int rank) {
    const StoreCase& p = GetParam();
    EngramStoreOptions o;
    o.checkpoint_dir = Checkpoint(p.format);
    o.source_open_mode = p.mode;
    o.io_backend = p.io;
    o.io_threads = 4;
    o.tp_size = p.tp;
    o.ranks = {rank};
    o.ram_cache_bytes = p.ram ? (4 << 20) : 0;
    if (p.rocksdb) {
      o.rocksdb_dir = mneme::testing::MakeTempDir("rocks") + "/db";
      o.rocksdb_budget_bytes = 64 << 20;
      o.rocksdb_write_buffer_bytes = 1 << 20;
    }
    if (p.local_copy) {
      o.local_copy_dir = mneme::testing::MakeTempDir("local") + "/copy";
      LocalizeOptions l;
      l.checkpoint_dir = o.checkpoint_dir;
      l.out_dir = o.local_copy_dir;
      l.target = {.tp_size = p.tp, .ranks = {rank}, .split = o.split};
      absl::StatusOr<LocalizeSummary> summary = Localize(l);
      if (!summary.ok()) return summary.status();
    }
    metrics_ = std::make_unique<MetricsRegistry>();
    return EngramStore::Create(o, metrics_.get());
  }
  std::unique_ptr<MetricsRegistry> metrics_;
};

TEST_P(EngramStoreTest, ReturnsExactlyTheDirectlyDecodedRows) {
  const StoreCase& p = GetParam();
  for (int rank = 0; rank < p.tp; ++rank) {
    absl::StatusOr<std::unique_ptr<EngramStore>> store = Open(rank);
    ASSERT_TRUE(store.ok()) << store.status();
    const EngramCheckpoint& c = (*store)->checkpoint();
    for (size_t t = 0; t < c.tables().size(); ++t) {
      const int layer = c.tables()[t].layer;
      const std::vector<int64_t> ids = ServedIds(**store, t, 300, rank + 1);
      for (RowEncoding encoding :
           {RowEncoding::kRaw, RowEncoding::kBf16, RowEncoding::kFp32}) {
        // Twice: cold (disk) and warm (caches).
        for (int pass = 0; pass < 2; ++pass) {
          absl::Status status;
          const std::vector<uint8_t> got =
              Lookup(**store, layer, ids, encoding, &status);
          ASSERT_TRUE(status.ok()) << status;
          EXPECT_TRUE(got == Expected(c, layer, ids, encoding))
              << "layer " << layer << " rank " << rank << " pass " << pass;
        }
      }
    }
    const EngramStoreStats stats = (*store)->GetStats();
    if (p.ram) {
      EXPECT_GT(stats.ram_hits, 0u);
    }
    if (p.local_copy) {
      EXPECT_GT(stats.local_rows, 0u);
      EXPECT_EQ(stats.source_rows, 0u);
    } else {
      EXPECT_GT(stats.source_rows, 0u);
    }
    EXPECT_LT(stats.rows_unique, stats.rows_requested);
    const std::string text = metrics_->ExportText();
    for (const char* series :
         {"mneme_engram_lookups_total", "mneme_engram_rows_served_total{tier=",
          "mneme_engram_bytes_read_total{source=",
          "mneme_engram_read_seconds_bucket", "mneme_engram_ram_cache_bytes",
          "mneme_engram_ram_cache_budget_bytes",
          "mneme_engram_prefetch_queue_rows"}) {
      EXPECT_NE(text.find(series), std::string::npos) << series;
    }
  }
}

TEST_P(EngramStoreTest, RefusesRowsOfOtherRanksAndPastTheTable) {
  const StoreCase& p = GetParam();
  absl::StatusOr<std::unique_ptr<EngramStore>> store = Open(p.tp - 1);
  ASSERT_TRUE(store.ok()) << store.status();
  const EngramCheckpoint& c = (*store)->checkpoint();
  const int layer = c.tables()[0].layer;
  absl::Status status;
  Lookup(**store, layer, {c.tables()[0].rows}, RowEncoding::kRaw, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  Lookup(**store, layer, {-1}, RowEncoding::kRaw, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  Lookup(**store, 2, {0}, RowEncoding::kRaw, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  if (p.tp > 1) {
    // The field bug: a rank other than 0 must not serve rank 0's rows.
    const int64_t rank0_row = 0;  // Column 0 belongs to rank 0.
    EXPECT_FALSE((*store)->Serves(layer, rank0_row));
    Lookup(**store, layer, {rank0_row}, RowEncoding::kRaw, &status);
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(status.message().find("not served by this store"),
              absl::string_view::npos);
  }
  // Rows just outside a served range are refused; its ends are served.
  for (const RowRange& r : (*store)->served_ranges()[0]) {
    EXPECT_TRUE((*store)->Serves(layer, r.begin));
    EXPECT_TRUE((*store)->Serves(layer, r.end - 1));
    if (r.end < c.tables()[0].rows && p.tp > 1) {
      EXPECT_FALSE((*store)->Serves(layer, r.end));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configurations, EngramStoreTest,
    ::testing::Values(StoreCase{.name = "Fp8PreadBufferedRam"},
                      StoreCase{.name = "Nvfp4UringDirectRam",
                                .format = formats::RowFormat::kNvfp4,
                                .io = IoBackend::kUring,
                                .mode = OpenMode::kDirect},
                      StoreCase{.name = "Fp8PreadNfsRamRocksDb",
                                .mode = OpenMode::kNfs,
                                .rocksdb = true},
                      StoreCase{.name = "Nvfp4PreadBufferedNoCacheTp4",
                                .format = formats::RowFormat::kNvfp4,
                                .ram = false,
                                .tp = 4},
                      StoreCase{.name = "Fp8UringBufferedLocalCopyTp4",
                                .io = IoBackend::kUring,
                                .local_copy = true,
                                .tp = 4},
                      StoreCase{.name = "Nvfp4PreadDirectRocksDbLocalCopyTp2",
                                .format = formats::RowFormat::kNvfp4,
                                .mode = OpenMode::kDirect,
                                .ram = false,
                                .rocksdb = true,
                                .local_copy = true,
                                .tp = 2}),
    [](const ::testing::TestParamInfo<StoreCase>& info) {
      return info.param.name;
    });

// Stores whose reader injects faults.
class EngramStoreFaultTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<EngramStore>> Open(
      const EngramStoreOptions& o, FaultInjectingRowReader** faults) {
    PreadPoolReaderOptions pool;
    pool.threads = 2;
    absl::StatusOr<std::unique_ptr<PreadPoolReader>> inner =
        PreadPoolReader::Create(pool);
    if (!inner.ok()) return inner.status();
    auto reader = std::make_unique<FaultInjectingRowReader>(*std::move(inner));
    *faults = reader.get();
    return EngramStore::Create(o, nullptr, std::move(reader));
  }
};

TEST_F(EngramStoreFaultTest, EioIsDataLossAndCachesNothingWrong) {
  EngramStoreOptions o;
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kFp8);
  FaultInjectingRowReader* faults = nullptr;
  auto store = Open(o, &faults);
  ASSERT_TRUE(store.ok()) << store.status();
  const EngramCheckpoint& c = (*store)->checkpoint();
  const std::vector<int64_t> ids = {5, 6, 7, 1000};
  faults->AddFault(Rule(ReadFault::kShortRead, 1));
  absl::Status status;
  Lookup(**store, 1, ids, RowEncoding::kRaw, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  faults->AddFault(Rule(ReadFault::kEio, 1));
  Lookup(**store, 1, ids, RowEncoding::kRaw, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  // Healthy again: the rows are right (no garbage was cached).
  const std::vector<uint8_t> got =
      Lookup(**store, 1, ids, RowEncoding::kRaw, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(got == Expected(c, 1, ids, RowEncoding::kRaw));
}

TEST_F(EngramStoreFaultTest, StallIsDeadlineExceededWithoutLeakingThreads) {
  EngramStoreOptions o;
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kNvfp4);
  o.prefetch_threads = 1;
  FaultInjectingRowReader* faults = nullptr;
  auto store = Open(o, &faults);
  ASSERT_TRUE(store.ok()) << store.status();
  const int threads_before = ThreadCount();
  faults->AddFault(Rule(ReadFault::kStall, -1));
  for (int i = 0; i < 5; ++i) {
    std::vector<uint8_t> out(144);
    const absl::Status status = (*store)->Lookup(
        1, {int64_t{100} + i}, RowEncoding::kRaw, absl::MakeSpan(out),
        absl::Now() + absl::Milliseconds(50));
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  }
  EXPECT_EQ(ThreadCount(), threads_before);
  faults->ClearFaults();
  faults->ReleaseStalls();
  absl::Status status;
  Lookup(**store, 1, {100, 101}, RowEncoding::kRaw, &status);
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(EngramStoreFaultTest, PrefetchQueueDropsInsteadOfBlocking) {
  EngramStoreOptions o;
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kFp8);
  o.prefetch_threads = 1;
  o.prefetch_queue_rows = 100;
  o.prefetch_timeout = absl::Seconds(30);
  FaultInjectingRowReader* faults = nullptr;
  auto store = Open(o, &faults);
  ASSERT_TRUE(store.ok()) << store.status();
  // The prefetch thread stalls on its first batch; the queue then fills.
  faults->AddFault(Rule(ReadFault::kStall, -1));
  std::vector<int64_t> ids(60);
  for (int i = 0; i < 60; ++i) ids[i] = i;
  EXPECT_EQ((*store)->Prefetch(1, ids), 60);
  faults->WaitForStalled(1);
  for (int i = 0; i < 60; ++i) ids[i] = 1000 + i;
  EXPECT_EQ((*store)->Prefetch(1, ids), 60);
  for (int i = 0; i < 60; ++i) ids[i] = 2000 + i;
  EXPECT_EQ((*store)->Prefetch(1, ids), 0);  // Would exceed 100 queued rows.
  EXPECT_EQ((*store)->GetStats().prefetch_dropped, 60u);
  faults->ClearFaults();
  faults->ReleaseStalls();
}

TEST(EngramStorePrefetchTest, PrefetchedRowsAreServedFromRam) {
  EngramStoreOptions o;
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kNvfp4);
  auto store = EngramStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<int64_t> ids;
  ids.reserve(500);
  for (int i = 0; i < 500; ++i) ids.push_back(int64_t{i} * 37);
  EXPECT_EQ((*store)->Prefetch(3, ids), 500);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  // Rows land in the RAM cache after they are read.
  while ((*store)->ram_cache()->GetStats().entries < 500) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(5));
  }
  const uint64_t source_before = (*store)->GetStats().source_rows;
  absl::Status status;
  Lookup(**store, 3, ids, RowEncoding::kBf16, &status);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*store)->GetStats().source_rows, source_before);
  EXPECT_EQ((*store)->GetStats().ram_hits, 500u);
}

TEST(EngramStorePrefetchTest, PrefetchTokensWarmsTheServedColumnsRows) {
  EngramStoreOptions o;
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kFp8);
  o.tp_size = 2;
  o.ranks = {1};
  auto store = EngramStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<int64_t> context = {7, 8, 9};
  const std::vector<int64_t> tokens = {300, 301, 302, 303, 304, 305};
  absl::StatusOr<int64_t> queued = (*store)->PrefetchTokens(1, context, tokens);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_GT(*queued, 0);
  EXPECT_LE(*queued,
            static_cast<int64_t>(tokens.size() * (*store)->columns().size()));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((*store)->ram_cache()->GetStats().entries <
         static_cast<uint64_t>(*queued)) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(5));
  }
  std::vector<int64_t> ids(tokens.size() * (*store)->columns().size());
  ASSERT_TRUE(
      (*store)
          ->checkpoint()
          .hasher()
          .ComputeColumnRowIds(1, context, tokens, (*store)->columns(), ids)
          .ok());
  absl::Status status;
  Lookup(**store, 1, ids, RowEncoding::kRaw, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ((*store)->GetStats().source_rows, static_cast<uint64_t>(*queued));
  EXPECT_EQ((*store)->PrefetchTokens(1, {}, {999999999}).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(EngramStoreBudgetTest, RamCacheStaysWithinBudgetUnderALongWorkload) {
  EngramStoreOptions o;
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kFp8);
  o.ram_cache_bytes = 1 << 20;  // ~3,500 rows of a ~56K-row checkpoint.
  auto store = EngramStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  std::mt19937_64 rng(9);
  const int64_t rows = (*store)->checkpoint().tables()[0].rows;
  for (int step = 0; step < 300; ++step) {
    std::vector<int64_t> ids(48);
    for (int64_t& id : ids) {
      // Zipf-like: most lookups in a hot head.
      id = (rng() % 4 == 0) ? static_cast<int64_t>(rng() % rows)
                            : static_cast<int64_t>(rng() % 2000);
    }
    absl::Status status;
    Lookup(**store, 1, ids, RowEncoding::kRaw, &status);
    ASSERT_TRUE(status.ok()) << status;
    const RowCacheStats stats = (*store)->ram_cache()->GetStats();
    ASSERT_LE(stats.bytes_in_use, stats.budget_bytes);
  }
  EXPECT_GT((*store)->GetStats().ram_hits, 0u);
}

TEST(EngramStoreCorruptionTest, TruncatedShardIsDataLossNamingIt) {
  synthetic::SyntheticCheckpointOptions s;
  s.out_dir = mneme::testing::MakeTempDir("trunc") + "/ckpt";
  ASSERT_TRUE(synthetic::MakeSyntheticCheckpoint(s).ok());
  EngramStoreOptions o;
  o.checkpoint_dir = s.out_dir;
  auto store = EngramStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string shard = (*store)->checkpoint().tables()[0].shard_path;
  ASSERT_EQ(truncate(shard.c_str(), 1 << 20), 0);
  const int64_t last = (*store)->checkpoint().tables()[0].rows - 1;
  absl::Status status;
  Lookup(**store, 1, {last}, RowEncoding::kRaw, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find(shard), absl::string_view::npos) << status;
  // The other table (another shard) still serves: the store keeps going.
  Lookup(**store, 3, {0, 1}, RowEncoding::kRaw, &status);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(EngramStoreCorruptionTest, TruncatedLocalCopyFallsBackToTheCheckpoint) {
  const std::string ckpt = Checkpoint(formats::RowFormat::kFp8);
  EngramStoreOptions o;
  o.checkpoint_dir = ckpt;
  o.tp_size = 2;
  o.ranks = {1};
  o.ram_cache_bytes = 0;
  o.local_copy_dir = mneme::testing::MakeTempDir("local-trunc") + "/copy";
  LocalizeOptions l;
  l.checkpoint_dir = ckpt;
  l.out_dir = o.local_copy_dir;
  l.target = {.tp_size = 2, .ranks = {1}, .split = o.split};
  ASSERT_TRUE(Localize(l).ok());
  auto store = EngramStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  // Cut the local data files after opening: reads past the cut fail there.
  ASSERT_TRUE(ReadLocalCopyManifest(o.local_copy_dir).ok());
  for (const auto& entry : fs::directory_iterator(o.local_copy_dir)) {
    if (entry.path().filename() != "manifest.json") {
      fs::resize_file(entry.path(), 4096);
    }
  }
  const auto& ranges = (*store)->served_ranges()[0];
  const std::vector<int64_t> ids = {ranges.back().end - 1, ranges[0].begin};
  absl::Status status;
  const std::vector<uint8_t> got =
      Lookup(**store, 1, ids, RowEncoding::kRaw, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(got ==
              Expected((*store)->checkpoint(), 1, ids, RowEncoding::kRaw));
  EXPECT_GT((*store)->GetStats().local_fallbacks, 0u);
}

TEST(EngramStoreOptionsTest, RejectsBadOptions) {
  EngramStoreOptions o;
  EXPECT_EQ(EngramStore::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.checkpoint_dir = Checkpoint(formats::RowFormat::kFp8);
  o.tp_size = 4;
  o.ranks = {4};
  EXPECT_EQ(EngramStore::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.ranks = {2, 1};
  EXPECT_EQ(EngramStore::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.ranks = {1};
  o.local_copy_dir = "/nonexistent/copy";
  EXPECT_EQ(EngramStore::Create(o).status().code(),
            absl::StatusCode::kNotFound);
  o.local_copy_dir = "";
  o.checkpoint_dir = "/nonexistent/ckpt";
  EXPECT_EQ(EngramStore::Create(o).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mneme::engram
