#include "gpu/cpu/fork_join_pool.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

class ForkJoinPoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ForkJoinPoolTest, RunCallsEveryTaskOnce) {
  ForkJoinPool pool(GetParam());
  EXPECT_EQ(pool.threads(), GetParam());
  for (int64_t tasks : {0, 1, 2, 3, 7, 100, 1000}) {
    std::vector<std::atomic<int>> calls(tasks);
    pool.Run(tasks, [&](int64_t i) { calls[i].fetch_add(1); });
    for (int64_t i = 0; i < tasks; ++i) {
      EXPECT_EQ(calls[i].load(), 1) << "task " << i << " of " << tasks;
    }
  }
}

TEST_P(ForkJoinPoolTest, ParallelForCoversTheRangeInChunks) {
  ForkJoinPool pool(GetParam());
  for (int64_t n : {0, 1, 5, 64, 1001}) {
    for (int64_t grain : {1, 3, 100, 5000}) {
      std::vector<std::atomic<int>> calls(n);
      std::atomic<int> chunks{0};
      pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
        EXPECT_LT(begin, end);
        chunks.fetch_add(1);
        for (int64_t i = begin; i < end; ++i) calls[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(calls[i].load(), 1);
      EXPECT_LE(chunks.load(), pool.threads());
      if (n > 0 && n < 2 * grain) {
        EXPECT_EQ(chunks.load(), 1);
      }
    }
  }
}

TEST_P(ForkJoinPoolTest, NestedRunsInline) {
  ForkJoinPool pool(GetParam());
  std::atomic<int> inner{0};
  pool.Run(8,
           [&](int64_t) { pool.Run(4, [&](int64_t) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 32);
}

TEST_P(ForkJoinPoolTest, ConcurrentCallersAreSerialised) {
  ForkJoinPool pool(GetParam());
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  callers.reserve(3);
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.Run(16, [&](int64_t i) { sum.fetch_add(i); });
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(sum.load(), 3 * 50 * (15 * 16 / 2));
}

INSTANTIATE_TEST_SUITE_P(Threads, ForkJoinPoolTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace mneme::gpu
