// Memory-budget acceptance for the RAM row cache: a long read-through
// workload of Zipf-like lookups over two tables (1M row lookups, decode-sized
// and prefill-sized batches) never takes bytes_in_use over the budget, and
// the process's resident memory grows by about the budget at most.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/process_memory.h"
#include "engram_store/cache/ram_row_cache.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "tests/engram_store/cache/test_rows.h"
#include "tests/engram_store/cache/zipf.h"

namespace mneme::engram {
namespace {

using testing::IsTestRow;
using testing::ScatterRank;
using testing::TestRows;
using testing::ZipfGenerator;

// Sanitizers' shadow memory and quarantines inflate resident memory.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif

// Resident set size of this process (common/process_memory.h).
uint64_t Resident() {
  const absl::StatusOr<int64_t> bytes = ResidentBytes();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? static_cast<uint64_t>(*bytes) : 0;
}

class RamRowCacheBudgetTest
    : public ::testing::TestWithParam<formats::RowFormat> {};

INSTANTIATE_TEST_SUITE_P(Formats, RamRowCacheBudgetTest,
                         ::testing::Values(formats::RowFormat::kFp8,
                                           formats::RowFormat::kNvfp4),
                         [](const auto& info) {
                           return std::string(
                               formats::RowFormatName(info.param));
                         });

TEST_P(RamRowCacheBudgetTest, LongZipfWorkloadStaysWithinBudget) {
  constexpr uint64_t kBudget = 48 << 20;
  constexpr uint64_t kRowLookups = 1000000;
  constexpr int kKeyBits = 24;  // 16M rows per table
  const size_t rb = formats::RowBytes(GetParam());

  // Scratch buffers sized for the largest batch, allocated before the
  // baseline so they do not count as growth.
  constexpr size_t kMaxBatch = 8192;
  std::vector<int64_t> ids;
  ids.reserve(kMaxBatch);
  std::vector<uint8_t> dst(kMaxBatch * rb);
  std::vector<bool> hits;
  hits.reserve(kMaxBatch);
  std::vector<int64_t> missed;
  missed.reserve(kMaxBatch);
  const uint64_t rss_before = Resident();

  RamRowCacheOptions options;
  options.row_bytes = rb;
  options.budget_bytes = kBudget;
  absl::StatusOr<std::unique_ptr<RamRowCache>> created =
      RamRowCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  RamRowCache& cache = **created;

  ZipfGenerator zipf(uint64_t{2} << kKeyBits, 0.9, 7);
  uint64_t done = 0;
  uint64_t batches = 0;
  uint64_t max_in_use = 0;
  uint64_t bad_rows = 0;
  while (done < kRowLookups) {
    // Mostly decode steps (8 x 6 tokens = 48 rows of a table), now and then
    // a prefill-sized batch.
    const size_t n = (batches % 64 == 63) ? kMaxBatch : 48;
    ids.clear();
    const uint64_t first = zipf.Next();
    const uint32_t table = (first & 1) != 0 ? 14 : 1;
    ids.push_back(static_cast<int64_t>(ScatterRank(first >> 1, kKeyBits)));
    while (ids.size() < n) {
      ids.push_back(
          static_cast<int64_t>(ScatterRank(zipf.Next() >> 1, kKeyBits)));
    }
    absl::Span<uint8_t> out(dst.data(), n * rb);
    ASSERT_TRUE(cache.LookupBatch(table, ids, out, &hits).ok());
    missed.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!hits[i]) {
        missed.push_back(ids[i]);
      } else if (!IsTestRow(table, ids[i], rb, out.data() + i * rb)) {
        ++bad_rows;
      }
    }
    ASSERT_TRUE(
        cache.InsertBatch(table, missed, TestRows(table, missed, rb)).ok());
    const RowCacheStats stats = cache.GetStats();
    ASSERT_LE(stats.bytes_in_use, kBudget) << "after batch " << batches;
    max_in_use = std::max(max_in_use, stats.bytes_in_use);
    done += n;
    ++batches;
  }
  const uint64_t rss_after = Resident();
  const RowCacheStats stats = cache.GetStats();
  EXPECT_EQ(bad_rows, 0u);
  EXPECT_EQ(stats.lookups, done);
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_LE(max_in_use, kBudget);
  // Best effort: resident memory grows by the budget plus allocator and
  // test slack at most (16 MiB).
  const int64_t rss_growth =
      static_cast<int64_t>(rss_after) - static_cast<int64_t>(rss_before);
  if (!kUnderSanitizer) {
    EXPECT_LE(rss_growth, static_cast<int64_t>(kBudget + (16 << 20)));
  }
  std::printf(
      "[%s] %lu row lookups in %lu batches: hit ratio %.3f, %lu evictions, "
      "%lu rows resident (capacity %lu), max bytes_in_use %lu of %lu, RSS "
      "growth %.1f MiB\n",
      formats::RowFormatName(GetParam()), static_cast<unsigned long>(done),
      static_cast<unsigned long>(batches),
      static_cast<double>(stats.hits) / stats.lookups,
      static_cast<unsigned long>(stats.evictions),
      static_cast<unsigned long>(stats.entries),
      static_cast<unsigned long>(cache.capacity_rows()),
      static_cast<unsigned long>(max_in_use),
      static_cast<unsigned long>(kBudget), rss_growth / 1048576.0);
}

}  // namespace
}  // namespace mneme::engram
