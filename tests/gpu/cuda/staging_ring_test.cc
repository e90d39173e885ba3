// The staging ring's offsets and waits: no copy ever reuses bytes whose
// earlier copy was not waited for, waits come oldest first, and a ring of
// small copies keeps many in flight.

#include "gpu/cuda/staging_ring.h"

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

constexpr uint64_t kFree = ~uint64_t{0};

TEST(StagingRingTest, NeverReusesBytesOfACopyNotWaitedFor) {
  for (const int64_t capacity : {int64_t{4096}, int64_t{10000}}) {
    StagingRing ring(capacity);
    ASSERT_EQ(ring.capacity() % StagingRing::kAlignment, 0);
    std::vector<uint64_t> owner(static_cast<size_t>(ring.capacity()), kFree);
    std::set<uint64_t> waited;
    std::mt19937 rng(static_cast<uint32_t>(capacity));
    uint64_t last_waited = 0;
    bool any_waited = false;
    for (uint64_t fence = 0; fence < 5000; ++fence) {
      const int64_t bytes =
          1 + static_cast<int64_t>(rng() %
                                   static_cast<uint32_t>(ring.capacity() / 3));
      ASSERT_TRUE(ring.Fits(bytes));
      const int64_t at = ring.Reserve(bytes, fence, [&](uint64_t f) {
        if (any_waited) {
          EXPECT_GT(f, last_waited) << "not oldest first";
        }
        last_waited = f;
        any_waited = true;
        waited.insert(f);
      });
      ASSERT_EQ(at % StagingRing::kAlignment, 0);
      ASSERT_GE(at, 0);
      ASSERT_LE(at + bytes, ring.capacity());
      for (int64_t b = at; b < at + bytes; ++b) {
        const uint64_t prev = owner[static_cast<size_t>(b)];
        ASSERT_TRUE(prev == kFree || waited.count(prev) == 1)
            << "byte " << b << " of copy " << prev << " reused by " << fence;
        owner[static_cast<size_t>(b)] = fence;
      }
    }
  }
}

TEST(StagingRingTest, SmallCopiesStayInFlightUntilTheRingComesRound) {
  StagingRing ring(64 * StagingRing::kAlignment);
  int waits = 0;
  const auto count = [&](uint64_t) { ++waits; };
  for (uint64_t f = 0; f < 64; ++f) ring.Reserve(100, f, count);
  EXPECT_EQ(waits, 0);
  EXPECT_EQ(ring.in_flight(), 64);
  // The 65th copy wraps and needs only the oldest copy's bytes.
  EXPECT_EQ(ring.Reserve(StagingRing::kAlignment, 64, count), 0);
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(ring.in_flight(), 64);
  ring.WaitOldest(count);
  EXPECT_EQ(waits, 2);
  EXPECT_EQ(ring.in_flight(), 63);
  ring.Drain(count);
  EXPECT_EQ(waits, 65);
  EXPECT_EQ(ring.in_flight(), 0);
  EXPECT_EQ(ring.Reserve(1, 65, count), 0);
}

TEST(StagingRingTest, OnlyCopiesUpToItsCapacityFit) {
  StagingRing ring(1000);  // Rounded down to 768.
  EXPECT_EQ(ring.capacity(), 768);
  EXPECT_TRUE(ring.Fits(768));
  EXPECT_FALSE(ring.Fits(769));
  EXPECT_FALSE(ring.Fits(0));
}

}  // namespace
}  // namespace mneme::gpu
