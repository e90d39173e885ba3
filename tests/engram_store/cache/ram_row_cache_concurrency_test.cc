// Several threads looking up and inserting overlapping rows of one RAM cache
// under eviction pressure: every hit must return exactly the bytes of its
// row, the budget must hold throughout, and the counters must add up.

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "engram_store/cache/ram_row_cache.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "tests/engram_store/cache/test_rows.h"
#include "tests/engram_store/cache/zipf.h"

namespace mneme::engram {
namespace {

using testing::IsTestRow;
using testing::TestRows;
using testing::ZipfGenerator;

TEST(RamRowCacheConcurrencyTest, ReadersAndWritersAgree) {
  RamRowCacheOptions options;
  options.row_bytes = formats::RowBytes(formats::RowFormat::kFp8);
  options.budget_bytes = 4 << 20;
  options.num_shards = 8;
  absl::StatusOr<std::unique_ptr<RamRowCache>> created =
      RamRowCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  RamRowCache& cache = **created;
  const size_t rb = options.row_bytes;

  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  std::atomic<uint64_t> looked_up{0};
  std::atomic<uint64_t> bad_rows{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> done{false};

  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ZipfGenerator zipf(60000, 0.9, 1000 + t);
      std::mt19937 rng(t);
      for (int it = 0; it < kIterations; ++it) {
        const uint32_t table = (it % 3 == 0) ? 14 : 1;
        const size_t n = (it % 50 == 0) ? 1000 : 48;
        std::vector<int64_t> ids(n);
        for (int64_t& id : ids) {
          id = static_cast<int64_t>(zipf.Next());
        }
        std::vector<uint8_t> dst(n * rb);
        std::vector<bool> hits;
        if (!cache.LookupBatch(table, ids, absl::MakeSpan(dst), &hits).ok()) {
          ++errors;
          continue;
        }
        looked_up += n;
        std::vector<int64_t> missed;
        for (size_t i = 0; i < n; ++i) {
          if (!hits[i]) {
            missed.push_back(ids[i]);
          } else if (!IsTestRow(table, ids[i], rb, dst.data() + i * rb)) {
            ++bad_rows;
          }
        }
        if (!cache.InsertBatch(table, missed, TestRows(table, missed, rb))
                 .ok()) {
          ++errors;
        }
      }
    });
  }
  std::atomic<uint64_t> over_budget{0};
  std::thread observer([&] {
    while (!done.load()) {
      const RowCacheStats stats = cache.GetStats();
      if (stats.bytes_in_use > stats.budget_bytes) {
        ++over_budget;
      }
      std::this_thread::yield();
    }
  });
  for (std::thread& t : threads) {
    t.join();
  }
  done = true;
  observer.join();

  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(bad_rows.load(), 0u);
  EXPECT_EQ(over_budget.load(), 0u);
  const RowCacheStats stats = cache.GetStats();
  EXPECT_EQ(stats.lookups, looked_up.load());
  EXPECT_EQ(stats.hits + stats.misses, stats.lookups);
  EXPECT_GT(stats.hits, 0u);
  EXPECT_GT(stats.evictions, 0u);
  // Two threads may insert the same missed row: the second overwrites.
  EXPECT_LE(stats.entries + stats.evictions, stats.inserts);
  EXPECT_LE(stats.entries, cache.capacity_rows());
  EXPECT_LE(stats.bytes_in_use, options.budget_bytes);
}

}  // namespace
}  // namespace mneme::engram
