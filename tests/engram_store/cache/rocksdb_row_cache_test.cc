#include "engram_store/cache/rocksdb_row_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "tests/engram_store/cache/test_rows.h"

namespace mneme::engram {
namespace {

namespace fs = std::filesystem;
using testing::IsTestRow;
using testing::TestRow;
using testing::TestRows;

constexpr size_t kRowBytes = formats::RowBytes(formats::RowFormat::kFp8);

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  std::error_code ec;
  fs::remove_all(dir, ec);
  return dir;
}

RocksDbRowCacheOptions SmallOptions(const std::string& path) {
  RocksDbRowCacheOptions o;
  o.path = path;
  o.source_id = "ckpt/model-00047-of-00048.safetensors:1234:5678;fp8;layer1";
  o.row_bytes = kRowBytes;
  o.budget_bytes = 64 << 20;
  o.write_buffer_bytes = 1 << 20;
  o.block_cache_bytes = 4 << 20;
  return o;
}

std::unique_ptr<RocksDbRowCache> Open(const RocksDbRowCacheOptions& o) {
  absl::StatusOr<std::unique_ptr<RocksDbRowCache>> cache =
      RocksDbRowCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) {
    return nullptr;
  }
  return *std::move(cache);
}

std::vector<int64_t> Iota(int64_t begin, size_t n) {
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), begin);
  return ids;
}

// Number of ids of `table` that hit with exactly their test bytes; fails the
// test on a hit with wrong bytes.
size_t CountGoodHits(RowCache& cache, uint32_t table,
                     const std::vector<int64_t>& ids) {
  std::vector<uint8_t> dst(ids.size() * cache.row_bytes());
  std::vector<bool> hits;
  absl::StatusOr<size_t> n =
      cache.LookupBatch(table, ids, absl::MakeSpan(dst), &hits);
  EXPECT_TRUE(n.ok()) << n.status();
  size_t good = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!hits[i]) {
      continue;
    }
    EXPECT_TRUE(IsTestRow(table, ids[i], cache.row_bytes(),
                          dst.data() + i * cache.row_bytes()))
        << "row " << ids[i];
    ++good;
  }
  EXPECT_EQ(good, n.ok() ? *n : 0);
  return good;
}

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uint64_t size = it->file_size(size_ec);
      if (!size_ec) {
        total += size;  // A file deleted meanwhile counts 0.
      }
    }
  }
  return total;
}

TEST(RocksDbRowCacheTest, RoundTrip) {
  const RocksDbRowCacheOptions o = SmallOptions(TempDir("round_trip"));
  auto cache = Open(o);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kCreated);
  EXPECT_EQ(cache->row_bytes(), kRowBytes);

  const std::vector<int64_t> ids = {0, 5, 383999999, kMaxRowCacheRowId};
  EXPECT_EQ(CountGoodHits(*cache, 1, ids), 0u);
  ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
  EXPECT_EQ(CountGoodHits(*cache, 1, ids), 4u);
  // Another table's rows with the same ids are separate.
  EXPECT_EQ(CountGoodHits(*cache, 14, ids), 0u);
  // Overwrite.
  std::vector<uint8_t> other(kRowBytes, 0x11);
  ASSERT_TRUE(cache->Insert(1, 5, other).ok());
  std::vector<uint8_t> one(kRowBytes);
  ASSERT_TRUE(*cache->Lookup(1, 5, absl::MakeSpan(one)));
  EXPECT_EQ(one, other);
  // Misses leave dst untouched.
  std::vector<uint8_t> untouched(kRowBytes, 0xEE);
  EXPECT_FALSE(*cache->Lookup(1, 6, absl::MakeSpan(untouched)));
  EXPECT_EQ(untouched, std::vector<uint8_t>(kRowBytes, 0xEE));

  const RowCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.lookups, 14u);
  EXPECT_EQ(stats.hits, 5u);
  EXPECT_EQ(stats.misses, 9u);
  EXPECT_EQ(stats.inserts, 5u);
  EXPECT_EQ(stats.corrupt_rows, 0u);
  EXPECT_EQ(stats.budget_bytes, o.budget_bytes);
}

TEST(RocksDbRowCacheTest, BadArgumentsAreRejected) {
  auto cache = Open(SmallOptions(TempDir("bad_args")));
  ASSERT_NE(cache, nullptr);
  std::vector<bool> hits;
  std::vector<uint8_t> dst(kRowBytes);
  const std::vector<int64_t> two = {1, 2};
  EXPECT_EQ(
      cache->LookupBatch(1, two, absl::MakeSpan(dst), &hits).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->InsertBatch(1, {-3}, dst).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->InsertBatch(kMaxRowCacheTableId + 1, {3}, dst).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->GetStats().inserts, 0u);
}

TEST(RocksDbRowCacheTest, WarmAcrossRestarts) {
  const RocksDbRowCacheOptions o = SmallOptions(TempDir("restart"));
  const std::vector<int64_t> ids = Iota(1000, 5000);
  {
    auto cache = Open(o);
    ASSERT_NE(cache, nullptr);
    ASSERT_TRUE(cache->InsertBatch(14, ids, TestRows(14, ids, kRowBytes)).ok());
  }  // Closing flushes the memtable (the WAL is off).
  auto cache = Open(o);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kReopened);
  EXPECT_EQ(CountGoodHits(*cache, 14, ids), ids.size());
  EXPECT_GT(cache->GetStats().bytes_in_use, ids.size() * kRowBytes);
}

TEST(RocksDbRowCacheTest, SourceChangeRebuilds) {
  RocksDbRowCacheOptions o = SmallOptions(TempDir("source_change"));
  const std::vector<int64_t> ids = Iota(0, 100);
  {
    auto cache = Open(o);
    ASSERT_NE(cache, nullptr);
    ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
  }
  o.source_id += "-rewritten";
  {
    auto cache = Open(o);
    ASSERT_NE(cache, nullptr);
    EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kRebuiltSourceChanged);
    EXPECT_EQ(CountGoodHits(*cache, 1, ids), 0u);
    ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
  }
  {
    // The new identity persisted: reopening keeps the new rows.
    auto cache = Open(o);
    ASSERT_NE(cache, nullptr);
    EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kReopened);
    EXPECT_EQ(CountGoodHits(*cache, 1, ids), ids.size());
  }
  // A different row size (format) is a different source too.
  o.row_bytes = formats::RowBytes(formats::RowFormat::kNvfp4);
  auto cache = Open(o);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kRebuiltSourceChanged);
  EXPECT_EQ(CountGoodHits(*cache, 1, ids), 0u);
}

enum class Damage {
  kGarbageOverEveryFile,
  kGarbageCurrent,
  kMissingCurrent,
  kTruncatedManifest,
  kGarbageTableFiles,
};

class RocksDbCorruptionTest : public ::testing::TestWithParam<Damage> {};

INSTANTIATE_TEST_SUITE_P(Damages, RocksDbCorruptionTest,
                         ::testing::Values(Damage::kGarbageOverEveryFile,
                                           Damage::kGarbageCurrent,
                                           Damage::kMissingCurrent,
                                           Damage::kTruncatedManifest,
                                           Damage::kGarbageTableFiles));

void WriteGarbage(const fs::path& file, size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string garbage(bytes, '\0');
  for (char& c : garbage) {
    c = static_cast<char>(rng());
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << garbage;
}

TEST_P(RocksDbCorruptionTest, DamagedDatabaseIsRebuilt) {
  const RocksDbRowCacheOptions o = SmallOptions(
      TempDir("corrupt_" + std::to_string(static_cast<int>(GetParam()))));
  const std::vector<int64_t> ids = Iota(0, 3000);
  {
    auto cache = Open(o);
    ASSERT_NE(cache, nullptr);
    ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
  }
  uint32_t seed = 1;
  for (const fs::directory_entry& e : fs::directory_iterator(o.path)) {
    const std::string name = e.path().filename().string();
    const size_t size = fs::file_size(e.path());
    switch (GetParam()) {
      case Damage::kGarbageOverEveryFile:
        WriteGarbage(e.path(), std::max<size_t>(size, 100), seed++);
        break;
      case Damage::kGarbageCurrent:
        if (name == "CURRENT") {
          WriteGarbage(e.path(), 40, seed++);
        }
        break;
      case Damage::kMissingCurrent:
        if (name == "CURRENT") {
          fs::remove(e.path());
        }
        break;
      case Damage::kTruncatedManifest:
        if (name.rfind("MANIFEST-", 0) == 0) {
          fs::resize_file(e.path(), size / 2);
        }
        break;
      case Damage::kGarbageTableFiles:
        if (e.path().extension() == ".sst") {
          WriteGarbage(e.path(), size, seed++);  // same size
        }
        break;
    }
  }
  {
    auto cache = Open(o);
    ASSERT_NE(cache, nullptr);
    EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kRebuiltCorrupt)
        << RocksDbOpenOutcomeName(cache->open_outcome());
    EXPECT_EQ(CountGoodHits(*cache, 1, ids), 0u);
    ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
    EXPECT_EQ(CountGoodHits(*cache, 1, ids), ids.size());
  }
  auto cache = Open(o);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kReopened);
  EXPECT_EQ(CountGoodHits(*cache, 1, ids), ids.size());
}

// A value of the wrong length (written behind the cache's back) is a miss
// counted as corrupt, and the next insert of the row repairs it.
TEST(RocksDbRowCacheTest, WrongValueLengthIsAMiss) {
  const RocksDbRowCacheOptions o = SmallOptions(TempDir("value_length"));
  { ASSERT_NE(Open(o), nullptr); }
  {
    rocksdb::DBOptions db_options;
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
        {"rows", rocksdb::ColumnFamilyOptions()}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(
        rocksdb::DB::Open(db_options, o.path, families, &handles, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const char key[8] = {0, 1, 0, 0, 0, 0, 0, 9};  // table 1, row 9
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[1],
                        rocksdb::Slice(key, 8), "short")
                    .ok());
    for (auto* h : handles) {
      ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
    }
    ASSERT_TRUE(db->Close().ok());
  }
  auto cache = Open(o);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->open_outcome(), RocksDbOpenOutcome::kReopened);
  std::vector<uint8_t> row(kRowBytes);
  EXPECT_FALSE(*cache->Lookup(1, 9, absl::MakeSpan(row)));
  EXPECT_EQ(cache->GetStats().corrupt_rows, 1u);
  ASSERT_TRUE(cache->Insert(1, 9, TestRow(1, 9, kRowBytes)).ok());
  EXPECT_TRUE(*cache->Lookup(1, 9, absl::MakeSpan(row)));
  EXPECT_EQ(row, TestRow(1, 9, kRowBytes));
}

TEST(RocksDbRowCacheTest, StaysWithinTheDiskBudget) {
  RocksDbRowCacheOptions o = SmallOptions(TempDir("budget"));
  o.budget_bytes = 24 << 20;
  o.write_buffer_bytes = 1 << 20;
  auto cache = Open(o);
  ASSERT_NE(cache, nullptr);
  // Write ten times the budget, checking the directory after every batch.
  constexpr size_t kBatch = 1024;
  const uint64_t target_rows = 10 * o.budget_bytes / kRowBytes;
  uint64_t max_dir = 0;
  int64_t next = 0;
  while (cache->GetStats().inserts < target_rows) {
    const std::vector<int64_t> ids = Iota(next, kBatch);
    const uint64_t dropped_before = cache->GetStats().dropped_inserts;
    ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
    if (cache->GetStats().dropped_inserts != dropped_before) {
      // RocksDB is stalling writes until a flush completes: retry later.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    next += kBatch;
    const uint64_t dir = DirectoryBytes(o.path);
    max_dir = std::max(max_dir, dir);
    ASSERT_LE(dir, o.budget_bytes) << "after " << next << " rows";
  }
  const RowCacheStats stats = cache->GetStats();
  EXPECT_LE(stats.bytes_in_use, o.budget_bytes);
  std::printf(
      "wrote %ld rows (%.0f MiB) into a %.0f MiB budget: max directory "
      "%.1f MiB, table files now %.1f MiB, %lu dropped inserts\n",
      static_cast<long>(next), next * static_cast<double>(kRowBytes) / 1048576,
      o.budget_bytes / 1048576.0, max_dir / 1048576.0,
      stats.bytes_in_use / 1048576.0,
      static_cast<unsigned long>(stats.dropped_inserts));
  // FIFO: the newest rows are there, the oldest are gone.
  EXPECT_GT(CountGoodHits(*cache, 1, Iota(next - 2000, 2000)), 1900u);
  EXPECT_EQ(CountGoodHits(*cache, 1, Iota(0, 2000)), 0u);
  cache.reset();
  EXPECT_LE(DirectoryBytes(o.path), o.budget_bytes);
}

TEST(RocksDbRowCacheTest, RefusesAForeignDirectory) {
  const std::string dir = TempDir("foreign");
  fs::create_directories(dir);
  std::ofstream(dir + "/precious.txt") << "not a cache";
  absl::StatusOr<std::unique_ptr<RocksDbRowCache>> cache =
      RocksDbRowCache::Create(SmallOptions(dir));
  EXPECT_EQ(cache.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::exists(dir + "/precious.txt"));
}

TEST(RocksDbRowCacheTest, RefusesAnotherApplicationsRocksDb) {
  const std::string dir = TempDir("foreign_rocksdb");
  {
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "k", "v").ok());
    ASSERT_TRUE(db->Close().ok());
  }
  EXPECT_EQ(RocksDbRowCache::Create(SmallOptions(dir)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value;
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "k", &value).ok());
  EXPECT_EQ(value, "v");
}

TEST(RocksDbRowCacheTest, RefusesAFilePath) {
  const std::string file = TempDir("a_file");
  std::ofstream(file) << "x";
  EXPECT_EQ(RocksDbRowCache::Create(SmallOptions(file)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RocksDbRowCacheTest, OneCachePerDirectory) {
  const RocksDbRowCacheOptions o = SmallOptions(TempDir("in_use"));
  auto first = Open(o);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(RocksDbRowCache::Create(o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  first.reset();
  EXPECT_NE(Open(o), nullptr);
}

TEST(RocksDbRowCacheTest, DirectReadsWhereSupported) {
  RocksDbRowCacheOptions o = SmallOptions(TempDir("direct"));
  o.direct_reads = true;
  fs::create_directories(o.path);
  const std::string probe = o.path + "/probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  const bool supported = fd >= 0;
  if (fd >= 0) {
    ::close(fd);
  }
  fs::remove(probe);
  absl::StatusOr<std::unique_ptr<RocksDbRowCache>> cache =
      RocksDbRowCache::Create(o);
  if (!supported) {
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
    GTEST_SKIP() << "no O_DIRECT on this filesystem";
  }
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::vector<int64_t> ids = Iota(0, 2000);
  ASSERT_TRUE((*cache)->InsertBatch(1, ids, TestRows(1, ids, kRowBytes)).ok());
  cache->reset();
  auto reopened = Open(o);
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(CountGoodHits(*reopened, 1, ids), ids.size());
}

TEST(RocksDbRowCacheOptionsTest, RejectsBadOptionsNamingTheField) {
  const RocksDbRowCacheOptions good = SmallOptions(TempDir("options"));
  const auto check = [](const RocksDbRowCacheOptions& o, const char* field) {
    absl::StatusOr<std::unique_ptr<RocksDbRowCache>> c =
        RocksDbRowCache::Create(o);
    ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(c.status().message().find(field), std::string::npos)
        << c.status();
  };
  RocksDbRowCacheOptions o = good;
  o.path = "";
  check(o, "path");
  o = good;
  o.source_id = "";
  check(o, "source_id");
  o = good;
  o.row_bytes = 0;
  check(o, "row_bytes");
  o = good;
  o.write_buffer_bytes = 1000;
  check(o, "write_buffer_bytes");
  o = good;
  o.budget_bytes = 8 << 20;  // < 8 MiB + 4 write buffers
  check(o, "budget_bytes");
  o = good;
  o.block_cache_bytes = 1000;
  check(o, "block_cache_bytes");
  o = good;
  o.bloom_bits_per_key = 33;
  check(o, "bloom_bits_per_key");
  // Nothing was created for rejected options.
  EXPECT_FALSE(fs::exists(good.path));
}

}  // namespace
}  // namespace mneme::engram
