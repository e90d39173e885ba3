// S3-FIFO vs plain LRU hit ratios on Zipf traces and on a Zipf trace mixed
// with one-hit wonders (rows of n-grams seen once), at equal entry capacity.
// The numbers are printed; S3-FIFO must not lose to LRU by more than a
// point on any of them (the traces are deterministic).

#include <cstdint>
#include <cstdio>
#include <random>

#include "engram_store/cache/s3_fifo_policy.h"
#include "gtest/gtest.h"
#include "tests/engram_store/cache/policy_sim.h"
#include "tests/engram_store/cache/zipf.h"

namespace mneme::engram {
namespace {

using testing::LruSim;
using testing::S3FifoSim;
using testing::ZipfGenerator;

struct Trace {
  double zipf_s;
  // Share of requests that go to a key never seen before or after.
  double one_hit_share;
};

struct Ratios {
  double s3fifo;
  double lru;
};

Ratios Simulate(const Trace& trace, uint64_t keys, uint32_t capacity,
                uint64_t requests) {
  S3FifoOptions options;
  options.capacity = capacity;
  S3FifoSim s3(options);
  LruSim lru(capacity);
  ZipfGenerator zipf(keys, trace.zipf_s, 12345);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> coin(0, 1);
  uint64_t next_unique = uint64_t{1} << 40;
  uint64_t s3_hits = 0;
  uint64_t lru_hits = 0;
  for (uint64_t r = 0; r < requests; ++r) {
    const uint64_t key =
        coin(rng) < trace.one_hit_share ? next_unique++ : zipf.Next();
    s3_hits += s3.Access(key) ? 1 : 0;
    lru_hits += lru.Access(key) ? 1 : 0;
  }
  return {static_cast<double>(s3_hits) / requests,
          static_cast<double>(lru_hits) / requests};
}

TEST(HitRatioTest, S3FifoVersusLru) {
  constexpr uint64_t kKeys = 1 << 20;
  constexpr uint64_t kRequests = 2000000;
  std::printf("%-6s %-9s %-9s %-8s %-8s %-7s\n", "zipf", "one-hit", "cache",
              "s3fifo", "lru", "delta");
  for (const Trace trace :
       {Trace{0.8, 0}, Trace{1.0, 0}, Trace{1.2, 0}, Trace{0.9, 0.3}}) {
    for (const double cache_share : {0.001, 0.01, 0.1}) {
      const auto capacity = static_cast<uint32_t>(kKeys * cache_share);
      const Ratios r = Simulate(trace, kKeys, capacity, kRequests);
      std::printf("%-6.1f %-9.1f %-9.3f %-8.4f %-8.4f %+.4f\n", trace.zipf_s,
                  trace.one_hit_share, cache_share, r.s3fifo, r.lru,
                  r.s3fifo - r.lru);
      EXPECT_GE(r.s3fifo, r.lru - 0.01)
          << "zipf " << trace.zipf_s << " one-hit " << trace.one_hit_share
          << " cache " << cache_share;
    }
  }
}

}  // namespace
}  // namespace mneme::engram
