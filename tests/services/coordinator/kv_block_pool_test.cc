#include "services/coordinator/kv_block_pool.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mneme::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvBlockPoolOptions Options(int64_t blocks_per_rank, int64_t block_size,
                           int dcp_size, int interleave, int64_t window) {
  KvBlockPoolOptions o;
  o.bytes_per_token = 3;
  o.block_size_tokens = block_size;
  o.bytes_per_rank = blocks_per_rank * block_size * o.bytes_per_token;
  o.dcp_size = dcp_size;
  o.dcp_interleave = interleave;
  o.sliding_window_tokens = window;
  return o;
}

std::unique_ptr<KvBlockPool> MakePool(const KvBlockPoolOptions& o) {
  absl::StatusOr<std::unique_ptr<KvBlockPool>> pool = KvBlockPool::Create(o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(KvBlockPoolTest, CreateRejectsInvalidOptionsNamingTheField) {
  struct Case {
    std::string field;
    void (*mutate)(KvBlockPoolOptions&);
  };
  const Case cases[] = {
      {"bytes_per_rank", [](KvBlockPoolOptions& o) { o.bytes_per_rank = 0; }},
      {"bytes_per_rank", [](KvBlockPoolOptions& o) { o.bytes_per_rank = -5; }},
      {"bytes_per_token", [](KvBlockPoolOptions& o) { o.bytes_per_token = 0; }},
      {"block_size_tokens",
       [](KvBlockPoolOptions& o) { o.block_size_tokens = 0; }},
      {"dcp_size", [](KvBlockPoolOptions& o) { o.dcp_size = 0; }},
      {"dcp_size", [](KvBlockPoolOptions& o) { o.dcp_size = 100000; }},
      {"dcp_interleave", [](KvBlockPoolOptions& o) { o.dcp_interleave = 0; }},
      {"sliding_window_tokens",
       [](KvBlockPoolOptions& o) { o.sliding_window_tokens = -1; }},
      // 10 blocks of 16 tokens x 3 bytes, one byte short.
      {"bytes_per_rank",
       [](KvBlockPoolOptions& o) { o.bytes_per_rank = 16 * 3 - 1; }},
  };
  for (const Case& c : cases) {
    KvBlockPoolOptions o = Options(10, 16, 1, 1, 0);
    c.mutate(o);
    absl::StatusOr<std::unique_ptr<KvBlockPool>> pool = KvBlockPool::Create(o);
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument)
        << c.field;
    EXPECT_THAT(pool.status().message(), HasSubstr(c.field));
  }
}

TEST(KvBlockPoolTest, DefaultsNeedOnlyBytesPerToken) {
  KvBlockPoolOptions o;
  EXPECT_EQ(KvBlockPool::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.bytes_per_token = 1024;
  std::unique_ptr<KvBlockPool> pool = MakePool(o);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->dcp_size(), 1);
  EXPECT_EQ(pool->block_size_tokens(), 16);
  EXPECT_EQ(pool->sliding_window_tokens(), 128);
  EXPECT_EQ(pool->block_bytes(), 16 * 1024);
  EXPECT_EQ(pool->blocks_per_rank(), (int64_t{6} << 30) / (int64_t{16} * 1024));
}

TEST(KvBlockPoolTest, CapacityRoundsDownToWholeBlocks) {
  KvBlockPoolOptions o = Options(10, 16, 2, 1, 0);
  o.bytes_per_rank += 16 * 3 - 1;
  std::unique_ptr<KvBlockPool> pool = MakePool(o);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->blocks_per_rank(), 10);
  EXPECT_EQ(pool->total_blocks(), 20);
  EXPECT_EQ(pool->free_blocks(1), 10);
}

TEST(KvBlockPoolTest, WorkedExamples) {
  // N = 4, I = 1, no window: length 10 puts 3, 3, 2, 2 entries on the
  // ranks, one block each; length 17 puts 5, 4, 4, 4.
  std::unique_ptr<KvBlockPool> pool = MakePool(Options(100, 4, 4, 1, 0));
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(7, 10).ok());
  EXPECT_THAT(pool->SequenceBlocks(7), ElementsAre(1, 1, 1, 1));
  ASSERT_TRUE(pool->Allocate(7, 7).ok());
  EXPECT_EQ(pool->length(7), 17);
  EXPECT_THAT(pool->SequenceBlocks(7), ElementsAre(2, 1, 1, 1));
  EXPECT_EQ(pool->total_used_blocks(), 5);

  // N = 2, I = 2, window 8: tokens 0-1, 4-5, 8-9 on rank 0, 2-3, 6-7 on
  // rank 1; each rank also keeps the 8-token window in 2 blocks.
  pool = MakePool(Options(100, 4, 2, 2, 8));
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->OwnedTokens(0, 10), 6);
  EXPECT_EQ(pool->OwnedTokens(1, 10), 4);
  ASSERT_TRUE(pool->Allocate(1, 10).ok());
  EXPECT_THAT(pool->SequenceBlocks(1), ElementsAre(2 + 2, 1 + 2));
  // The window stops growing at 8 tokens.
  ASSERT_TRUE(pool->Allocate(1, 90).ok());
  EXPECT_THAT(pool->SequenceBlocks(1), ElementsAre(13 + 2, 13 + 2));
}

class DcpLayoutTest
    : public ::testing::TestWithParam<std::tuple<int, int, int64_t, int64_t>> {
};

TEST_P(DcpLayoutTest, OwnershipAndBlocksMatchBruteForce) {
  const auto [n, interleave, block, window] = GetParam();
  std::unique_ptr<KvBlockPool> pool =
      MakePool(Options(1000, block, n, interleave, window));
  ASSERT_NE(pool, nullptr);
  std::vector<int64_t> owned(n, 0);
  for (int64_t length = 0; length <= 300; ++length) {
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(pool->OwnedTokens(r, length), owned[r])
          << "rank " << r << " length " << length;
      const int64_t expected_blocks =
          length == 0 ? 0
                      : (owned[r] + block - 1) / block +
                            (std::min(length, window) + block - 1) / block;
      ASSERT_EQ(pool->BlocksFor(r, length), expected_blocks)
          << "rank " << r << " length " << length;
    }
    // Token `length` joins the next length.
    const int owner = pool->OwnerRank(length);
    ASSERT_EQ(owner, (length / interleave) % n);
    ++owned[owner];
  }
  // Entries are spread evenly: over whole periods every rank has I per
  // period.
  const int64_t period = int64_t{interleave} * n;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(pool->OwnedTokens(r, period * 7), 7 * interleave);
  }
}

TEST_P(DcpLayoutTest, GrowthInStepsHoldsWhatTheLengthNeeds) {
  const auto [n, interleave, block, window] = GetParam();
  std::unique_ptr<KvBlockPool> pool =
      MakePool(Options(1000, block, n, interleave, window));
  ASSERT_NE(pool, nullptr);
  std::mt19937_64 rng(n * 100 + interleave);
  std::uniform_int_distribution<int64_t> step(0, 37);
  int64_t a = 0;
  int64_t b = 0;
  for (int i = 0; i < 60; ++i) {
    const int64_t da = step(rng);
    const int64_t db = step(rng);
    ASSERT_TRUE(pool->Allocate(1, da).ok());
    ASSERT_TRUE(pool->Allocate(2, db).ok());
    a += da;
    b += db;
    ASSERT_EQ(pool->length(1), a);
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(pool->SequenceBlocks(1)[r], pool->BlocksFor(r, a));
      ASSERT_EQ(pool->SequenceBlocks(2)[r], pool->BlocksFor(r, b));
      ASSERT_EQ(pool->used_blocks(r),
                pool->BlocksFor(r, a) + pool->BlocksFor(r, b));
      total += pool->used_blocks(r);
    }
    ASSERT_EQ(pool->total_used_blocks(), total);
  }
  ASSERT_TRUE(pool->Free(1).ok());
  ASSERT_TRUE(pool->Free(2).ok());
  EXPECT_EQ(pool->total_used_blocks(), 0);
  EXPECT_EQ(pool->num_sequences(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DcpLayoutTest,
    ::testing::Values(std::make_tuple(1, 1, 16, 128),
                      std::make_tuple(2, 1, 4, 0), std::make_tuple(3, 1, 5, 7),
                      std::make_tuple(4, 1, 4, 8), std::make_tuple(4, 2, 4, 0),
                      std::make_tuple(4, 3, 3, 16), std::make_tuple(2, 8, 4, 8),
                      std::make_tuple(8, 4, 16, 128)));

TEST(KvBlockPoolTest, FailedGrowthChangesNothingOnAnyRank) {
  // N = 2, I = 4, block 4, no window, 3 blocks per rank: a length of 20
  // puts 12 entries on rank 0 (3 blocks) and 8 on rank 1 (2 blocks).
  std::unique_ptr<KvBlockPool> pool = MakePool(Options(3, 4, 2, 4, 0));
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->Allocate(1, 20).ok());
  EXPECT_THAT(pool->SequenceBlocks(1), ElementsAre(3, 2));
  // Token 24 lives on rank 0, which is full; rank 1 has room but takes
  // nothing.
  EXPECT_FALSE(pool->CanAllocate(1, 5));
  EXPECT_EQ(pool->Allocate(1, 5).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->length(1), 20);
  EXPECT_THAT(pool->SequenceBlocks(1), ElementsAre(3, 2));
  EXPECT_EQ(pool->used_blocks(0), 3);
  EXPECT_EQ(pool->used_blocks(1), 2);
  // A new sequence fails the same way and is not recorded.
  EXPECT_EQ(pool->Allocate(2, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_sequences(), 1);
  EXPECT_EQ(pool->Free(2).code(), absl::StatusCode::kNotFound);
  // Tokens 20-23 live on rank 1, which has room.
  EXPECT_TRUE(pool->CanAllocate(1, 4));
  ASSERT_TRUE(pool->Allocate(1, 4).ok());
  EXPECT_THAT(pool->SequenceBlocks(1), ElementsAre(3, 3));
  EXPECT_DOUBLE_EQ(pool->Usage(0), 1.0);
  EXPECT_DOUBLE_EQ(pool->TotalUsage(), 1.0);
  ASSERT_TRUE(pool->Free(1).ok());
  EXPECT_DOUBLE_EQ(pool->TotalUsage(), 0.0);
  EXPECT_TRUE(pool->Allocate(2, 24).ok());
}

TEST(KvBlockPoolTest, BadArgumentsAndUnknownSequences) {
  std::unique_ptr<KvBlockPool> pool = MakePool(Options(10, 4, 1, 1, 0));
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->Allocate(1, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(pool->CanAllocate(1, -1));
  EXPECT_EQ(pool->Allocate(1, int64_t{1} << 41).code(),
            absl::StatusCode::kInvalidArgument);
  // Growing by nothing records nothing.
  EXPECT_TRUE(pool->Allocate(1, 0).ok());
  EXPECT_EQ(pool->num_sequences(), 0);
  EXPECT_EQ(pool->Free(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->length(1), 0);
  EXPECT_THAT(pool->SequenceBlocks(1), ElementsAre(0));
  // Everything fits exactly; one more token does not.
  EXPECT_TRUE(pool->Allocate(1, 40).ok());
  EXPECT_EQ(pool->free_blocks(0), 0);
  EXPECT_EQ(pool->Allocate(3, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool->Free(1).ok());
  EXPECT_EQ(pool->Free(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->free_blocks(0), 10);
}

}  // namespace
}  // namespace mneme::coordinator
