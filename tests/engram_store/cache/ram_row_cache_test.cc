#include "engram_store/cache/ram_row_cache.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "tests/engram_store/cache/test_rows.h"

namespace mneme::engram {
namespace {

using testing::TestRow;
using testing::TestRows;

std::unique_ptr<RamRowCache> MakeCache(const RamRowCacheOptions& options) {
  absl::StatusOr<std::unique_ptr<RamRowCache>> cache =
      RamRowCache::Create(options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return *std::move(cache);
}

class RamRowCacheTest : public ::testing::TestWithParam<formats::RowFormat> {
 protected:
  size_t row_bytes() const { return formats::RowBytes(GetParam()); }
  RamRowCacheOptions Options(uint64_t budget, int shards) const {
    RamRowCacheOptions o;
    o.row_bytes = row_bytes();
    o.budget_bytes = budget;
    o.num_shards = shards;
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Formats, RamRowCacheTest,
                         ::testing::Values(formats::RowFormat::kFp8,
                                           formats::RowFormat::kNvfp4),
                         [](const auto& info) {
                           return std::string(
                               formats::RowFormatName(info.param));
                         });

TEST_P(RamRowCacheTest, MissThenHitAfterInsert) {
  auto cache = MakeCache(Options(4 << 20, 4));
  const size_t rb = row_bytes();
  const std::vector<int64_t> ids = {0, 7, 383999999, 12345};
  std::vector<uint8_t> dst(ids.size() * rb, 0xAB);
  std::vector<bool> hits;
  ASSERT_EQ(*cache->LookupBatch(1, ids, absl::MakeSpan(dst), &hits), 0u);
  EXPECT_EQ(hits, std::vector<bool>(4, false));
  // Misses leave dst untouched.
  EXPECT_EQ(dst, std::vector<uint8_t>(ids.size() * rb, 0xAB));

  const std::vector<int64_t> some = {7, 12345};
  ASSERT_TRUE(cache->InsertBatch(1, some, TestRows(1, some, rb)).ok());
  ASSERT_EQ(*cache->LookupBatch(1, ids, absl::MakeSpan(dst), &hits), 2u);
  EXPECT_EQ(hits, std::vector<bool>({false, true, false, true}));
  EXPECT_EQ(std::vector<uint8_t>(dst.begin() + rb, dst.begin() + 2 * rb),
            TestRow(1, 7, rb));
  EXPECT_EQ(std::vector<uint8_t>(dst.begin() + 3 * rb, dst.end()),
            TestRow(1, 12345, rb));
  EXPECT_EQ(std::vector<uint8_t>(dst.begin(), dst.begin() + rb),
            std::vector<uint8_t>(rb, 0xAB));

  const RowCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.lookups, 8u);
  EXPECT_EQ(stats.hits, 2u);
  EXPECT_EQ(stats.misses, 6u);
  EXPECT_EQ(stats.inserts, 2u);
  EXPECT_EQ(stats.entries, 2u);
  EXPECT_EQ(stats.evictions, 0u);
}

TEST_P(RamRowCacheTest, SingleRowHelpers) {
  auto cache = MakeCache(Options(1 << 20, 1));
  const size_t rb = row_bytes();
  std::vector<uint8_t> dst(rb);
  EXPECT_FALSE(*cache->Lookup(14, 5, absl::MakeSpan(dst)));
  ASSERT_TRUE(cache->Insert(14, 5, TestRow(14, 5, rb)).ok());
  EXPECT_TRUE(*cache->Lookup(14, 5, absl::MakeSpan(dst)));
  EXPECT_EQ(dst, TestRow(14, 5, rb));
}

TEST_P(RamRowCacheTest, TablesAreSeparateKeys) {
  auto cache = MakeCache(Options(1 << 20, 2));
  const size_t rb = row_bytes();
  ASSERT_TRUE(cache->Insert(1, 42, TestRow(1, 42, rb)).ok());
  ASSERT_TRUE(cache->Insert(14, 42, TestRow(14, 42, rb)).ok());
  std::vector<uint8_t> dst(rb);
  ASSERT_TRUE(*cache->Lookup(1, 42, absl::MakeSpan(dst)));
  EXPECT_EQ(dst, TestRow(1, 42, rb));
  ASSERT_TRUE(*cache->Lookup(14, 42, absl::MakeSpan(dst)));
  EXPECT_EQ(dst, TestRow(14, 42, rb));
  EXPECT_FALSE(*cache->Lookup(2, 42, absl::MakeSpan(dst)));
  EXPECT_TRUE(
      cache->Insert(kMaxRowCacheTableId, kMaxRowCacheRowId, TestRow(0, 0, rb))
          .ok());
  EXPECT_TRUE(*cache->Lookup(kMaxRowCacheTableId, kMaxRowCacheRowId,
                             absl::MakeSpan(dst)));
}

TEST_P(RamRowCacheTest, DuplicatesAndOverwrites) {
  auto cache = MakeCache(Options(1 << 20, 4));
  const size_t rb = row_bytes();
  const std::vector<int64_t> ids = {3, 3, 4, 3};
  std::vector<uint8_t> rows = TestRows(1, ids, rb);
  // The last copy of a duplicated id wins.
  std::fill(rows.begin() + 3 * rb, rows.end(), 0x5A);
  ASSERT_TRUE(cache->InsertBatch(1, ids, rows).ok());
  EXPECT_EQ(cache->GetStats().entries, 2u);
  std::vector<uint8_t> dst(ids.size() * rb);
  std::vector<bool> hits;
  ASSERT_EQ(*cache->LookupBatch(1, ids, absl::MakeSpan(dst), &hits), 4u);
  EXPECT_EQ(std::vector<uint8_t>(dst.begin(), dst.begin() + rb),
            std::vector<uint8_t>(rb, 0x5A));
  EXPECT_EQ(std::vector<uint8_t>(dst.begin() + 2 * rb, dst.begin() + 3 * rb),
            TestRow(1, 4, rb));
  // Overwrite with new bytes.
  ASSERT_TRUE(cache->Insert(1, 3, TestRow(1, 3, rb)).ok());
  std::vector<uint8_t> one(rb);
  ASSERT_TRUE(*cache->Lookup(1, 3, absl::MakeSpan(one)));
  EXPECT_EQ(one, TestRow(1, 3, rb));
}

TEST_P(RamRowCacheTest, BadArgumentsAreRejectedAndChangeNothing) {
  auto cache = MakeCache(Options(1 << 20, 4));
  const size_t rb = row_bytes();
  std::vector<bool> hits;
  std::vector<uint8_t> dst(2 * rb);
  const std::vector<int64_t> two = {1, 2};
  EXPECT_EQ(cache->LookupBatch(1, two, absl::MakeSpan(dst.data(), rb), &hits)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      cache->LookupBatch(1, two, absl::MakeSpan(dst), nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache
                ->LookupBatch(kMaxRowCacheTableId + 1, two, absl::MakeSpan(dst),
                              &hits)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->InsertBatch(1, two, std::vector<uint8_t>(rb)).code(),
            absl::StatusCode::kInvalidArgument);
  // A bad id in the middle of a batch: nothing of the batch is inserted.
  const std::vector<int64_t> bad = {5, -1, 6};
  EXPECT_EQ(cache->InsertBatch(1, bad, TestRows(1, {5, 0, 6}, rb)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> too_big = {5, kMaxRowCacheRowId + 1};
  EXPECT_EQ(cache->InsertBatch(1, too_big, TestRows(1, {5, 0}, rb)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->GetStats().entries, 0u);
  EXPECT_EQ(cache->GetStats().inserts, 0u);
  EXPECT_EQ(cache->GetStats().lookups, 0u);
}

TEST_P(RamRowCacheTest, EmptyBatches) {
  auto cache = MakeCache(Options(1 << 20, 4));
  std::vector<bool> hits = {true};
  EXPECT_EQ(*cache->LookupBatch(1, {}, {}, &hits), 0u);
  EXPECT_TRUE(hits.empty());
  EXPECT_TRUE(cache->InsertBatch(1, {}, {}).ok());
}

TEST_P(RamRowCacheTest, EvictsToStayWithinBudget) {
  const uint64_t budget = 2 << 20;
  auto cache = MakeCache(Options(budget, 4));
  const size_t rb = row_bytes();
  const uint64_t capacity = cache->capacity_rows();
  ASSERT_GT(capacity, 1000u);
  // Little waste: the budget goes to rows, with < 64 bytes of metadata each.
  EXPECT_LT(budget / capacity, rb + 64);

  const auto total = static_cast<int64_t>(capacity * 3);
  for (int64_t begin = 0; begin < total; begin += 1000) {
    std::vector<int64_t> ids(std::min<int64_t>(1000, total - begin));
    std::iota(ids.begin(), ids.end(), begin);
    ASSERT_TRUE(cache->InsertBatch(1, ids, TestRows(1, ids, rb)).ok());
    const RowCacheStats stats = cache->GetStats();
    ASSERT_LE(stats.bytes_in_use, budget);
    ASSERT_LE(stats.entries, capacity);
  }
  const RowCacheStats stats = cache->GetStats();
  EXPECT_EQ(stats.inserts, static_cast<uint64_t>(total));
  EXPECT_EQ(stats.entries, stats.inserts - stats.evictions);
  // Shards fill unevenly, but together they are close to full.
  EXPECT_GT(stats.entries, capacity * 9 / 10);
  EXPECT_GT(stats.bytes_in_use, budget * 9 / 10);

  // Every hit returns exactly the bytes inserted for that row (slot reuse
  // never mixes rows up), and the hit count equals the resident rows.
  std::vector<int64_t> all(total);
  std::iota(all.begin(), all.end(), 0);
  std::vector<uint8_t> dst(all.size() * rb);
  std::vector<bool> hits;
  const size_t found = *cache->LookupBatch(1, all, absl::MakeSpan(dst), &hits);
  EXPECT_EQ(found, stats.entries);
  for (size_t i = 0; i < all.size(); ++i) {
    if (!hits[i]) {
      continue;
    }
    ASSERT_EQ(
        std::memcmp(dst.data() + i * rb, TestRow(1, all[i], rb).data(), rb), 0)
        << all[i];
  }
}

// Hot rows that were hit survive a long scan of rows seen once (the small
// queue absorbs the scan); under LRU the scan would flush them.
TEST_P(RamRowCacheTest, HotRowsSurviveAScan) {
  auto cache = MakeCache(Options(1 << 20, 1));
  const size_t rb = row_bytes();
  const auto capacity = static_cast<int64_t>(cache->capacity_rows());
  std::vector<int64_t> hot(capacity / 2);
  std::iota(hot.begin(), hot.end(), 0);
  ASSERT_TRUE(cache->InsertBatch(1, hot, TestRows(1, hot, rb)).ok());
  std::vector<uint8_t> dst(hot.size() * rb);
  std::vector<bool> hits;
  ASSERT_EQ(*cache->LookupBatch(1, hot, absl::MakeSpan(dst), &hits),
            hot.size());
  for (int64_t begin = 1 << 20; begin < (1 << 20) + 10 * capacity;
       begin += 256) {
    std::vector<int64_t> scan(256);
    std::iota(scan.begin(), scan.end(), begin);
    ASSERT_TRUE(cache->InsertBatch(1, scan, TestRows(1, scan, rb)).ok());
  }
  EXPECT_EQ(*cache->LookupBatch(1, hot, absl::MakeSpan(dst), &hits),
            hot.size());
}

TEST_P(RamRowCacheTest, ManyShardsAndLargeBatches) {
  auto cache = MakeCache(Options(64 << 20, 1024));
  const size_t rb = row_bytes();
  std::vector<int64_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>(i * 7919 % 1000003);
  }
  ASSERT_TRUE(cache->InsertBatch(14, ids, TestRows(14, ids, rb)).ok());
  std::vector<uint8_t> dst(ids.size() * rb);
  std::vector<bool> hits;
  ASSERT_EQ(*cache->LookupBatch(14, ids, absl::MakeSpan(dst), &hits),
            ids.size());
  EXPECT_EQ(dst, TestRows(14, ids, rb));
  EXPECT_EQ(cache->GetStats().evictions, 0u);
}

TEST(RamRowCacheOptionsTest, RejectsBadOptionsNamingTheField) {
  const auto check = [](RamRowCacheOptions o, const char* field) {
    absl::StatusOr<std::unique_ptr<RamRowCache>> c = RamRowCache::Create(o);
    ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(c.status().message().find(field), std::string::npos)
        << c.status();
  };
  RamRowCacheOptions good;
  good.row_bytes = 264;
  ASSERT_TRUE(RamRowCache::Create(good).ok());

  RamRowCacheOptions o = good;
  o.row_bytes = 0;
  check(o, "row_bytes");
  o.row_bytes = 65537;
  check(o, "row_bytes");
  o = good;
  o.num_shards = 3;
  check(o, "num_shards");
  o.num_shards = 0;
  check(o, "num_shards");
  o.num_shards = 2048;
  check(o, "num_shards");
  o = good;
  o.budget_bytes = 4096;
  check(o, "budget_bytes");
  o = good;
  o.small_queue_fraction = 0;
  check(o, "small_queue_fraction");
  o = good;
  o.ghost_fraction = -1;
  check(o, "ghost_fraction");
  o = good;
  o.slab_bytes = 1000;
  check(o, "slab_bytes");
}

TEST(RamRowCacheOptionsTest, DefaultsAreValid) {
  RamRowCacheOptions o;
  o.row_bytes = formats::RowBytes(formats::RowFormat::kNvfp4);
  absl::StatusOr<std::unique_ptr<RamRowCache>> c = RamRowCache::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  // Nothing but metadata is allocated up front.
  const RowCacheStats stats = (*c)->GetStats();
  EXPECT_LE(stats.bytes_in_use, o.budget_bytes / 4);
  EXPECT_EQ(stats.budget_bytes, o.budget_bytes);
}

}  // namespace
}  // namespace mneme::engram
