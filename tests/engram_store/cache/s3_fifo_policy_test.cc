#include "engram_store/cache/s3_fifo_policy.h"

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

using Queue = S3FifoPolicy::Queue;

std::unique_ptr<S3FifoPolicy> MakePolicy(uint32_t capacity,
                                         double ghost_fraction = 0.9,
                                         int promote_threshold = 1) {
  S3FifoOptions options;
  options.capacity = capacity;
  options.ghost_fraction = ghost_fraction;
  options.promote_threshold = promote_threshold;
  absl::StatusOr<std::unique_ptr<S3FifoPolicy>> policy =
      S3FifoPolicy::Create(options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *std::move(policy);
}

// Fills a capacity-10 policy with fingerprints 0..9: fingerprint k in slot k.
// Slot 0 is the small queue's only entry (target 1); 1..9 went to the main
// queue (the filling-phase rule).
std::unique_ptr<S3FifoPolicy> FilledTen(double ghost_fraction = 0.9,
                                        int promote_threshold = 1) {
  auto p = MakePolicy(10, ghost_fraction, promote_threshold);
  for (uint32_t k = 0; k < 10; ++k) {
    const S3FifoPolicy::Admission a = p->Admit(k);
    EXPECT_EQ(a.slot, k);
    EXPECT_FALSE(a.evicted);
  }
  return p;
}

TEST(S3FifoPolicyTest, RejectsBadOptionsNamingTheField) {
  struct Case {
    S3FifoOptions options;
    const char* field;
  };
  std::vector<Case> cases;
  S3FifoOptions o;
  o.capacity = 0;
  cases.push_back({o, "capacity"});
  o = S3FifoOptions{};
  o.capacity = 10;
  o.small_fraction = 0;
  cases.push_back({o, "small_fraction"});
  o.small_fraction = 1;
  cases.push_back({o, "small_fraction"});
  o = S3FifoOptions{};
  o.capacity = 10;
  o.ghost_fraction = -0.1;
  cases.push_back({o, "ghost_fraction"});
  o.ghost_fraction = 5;
  cases.push_back({o, "ghost_fraction"});
  o = S3FifoOptions{};
  o.capacity = 10;
  o.promote_threshold = 0;
  cases.push_back({o, "promote_threshold"});
  o.promote_threshold = 4;
  cases.push_back({o, "promote_threshold"});
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<S3FifoPolicy>> p =
        S3FifoPolicy::Create(c.options);
    ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(p.status().message().find(c.field), std::string::npos)
        << p.status();
  }
}

TEST(S3FifoPolicyTest, HandsOutSlotsInIncreasingOrderWhileFilling) {
  auto p = FilledTen();
  EXPECT_EQ(p->size(), 10u);
  EXPECT_EQ(p->small_target(), 1u);
  EXPECT_EQ(p->QueueOf(0), Queue::kSmall);
  for (uint32_t s = 1; s < 10; ++s) {
    EXPECT_EQ(p->QueueOf(s), Queue::kMain);
  }
  EXPECT_EQ(p->small_size(), 1u);
  EXPECT_EQ(p->main_size(), 9u);
}

TEST(S3FifoPolicyTest, OneHitWondersAreEvictedFromTheSmallQueue) {
  auto p = FilledTen();
  // A stream of keys seen once: each evicts the previous newcomer from the
  // small queue; the main queue is never touched.
  for (uint32_t k = 100; k < 150; ++k) {
    const S3FifoPolicy::Admission a = p->Admit(k);
    EXPECT_TRUE(a.evicted);
    EXPECT_EQ(a.slot, 0u);
    EXPECT_EQ(p->QueueOf(0), Queue::kSmall);
  }
  for (uint32_t s = 1; s < 10; ++s) {
    EXPECT_EQ(p->QueueOf(s), Queue::kMain);
  }
  // The evicted one-hit wonders are remembered in the ghost queue.
  EXPECT_TRUE(p->InGhost(148));
  EXPECT_FALSE(p->InGhost(149));  // still resident
}

TEST(S3FifoPolicyTest, AccessedSmallEntriesArePromotedToMain) {
  auto p = FilledTen();
  p->Admit(100);  // evicts fingerprint 0 from slot 0, takes slot 0
  p->Touch(0);
  // Next admission: slot 0 (touched) moves to main with frequency reset; main
  // is now over its target, so main's tail (fingerprint 1, slot 1, never
  // touched) is evicted -- without a ghost entry.
  const S3FifoPolicy::Admission a = p->Admit(101);
  EXPECT_TRUE(a.evicted);
  EXPECT_EQ(a.slot, 1u);
  EXPECT_EQ(p->QueueOf(0), Queue::kMain);
  EXPECT_EQ(p->FrequencyOf(0), 0);
  EXPECT_EQ(p->QueueOf(1), Queue::kSmall);  // now fingerprint 101
  EXPECT_FALSE(p->InGhost(1));
  EXPECT_EQ(p->main_size(), 9u);
  EXPECT_EQ(p->small_size(), 1u);
}

TEST(S3FifoPolicyTest, PromoteThresholdTwoNeedsTwoHits) {
  auto p = FilledTen(/*ghost_fraction=*/0.9, /*promote_threshold=*/2);
  p->Admit(100);
  p->Touch(0);
  // One hit is not enough: evicted from small into the ghost.
  const S3FifoPolicy::Admission a = p->Admit(101);
  EXPECT_EQ(a.slot, 0u);
  EXPECT_TRUE(p->InGhost(100));
  p->Touch(0);
  p->Touch(0);
  const S3FifoPolicy::Admission b = p->Admit(102);
  EXPECT_EQ(b.slot, 1u);  // 101 promoted, main's tail evicted instead
  EXPECT_EQ(p->QueueOf(0), Queue::kMain);
}

TEST(S3FifoPolicyTest, GhostHitsGoStraightToMain) {
  auto p = FilledTen();
  p->Admit(100);  // evicts fingerprint 0 (small, untouched) into the ghost
  EXPECT_TRUE(p->InGhost(0));
  EXPECT_EQ(p->ghost_size(), 1u);
  // Fingerprint 0 comes back: it is admitted to main and leaves the ghost.
  const S3FifoPolicy::Admission a = p->Admit(0);
  EXPECT_TRUE(a.evicted);
  EXPECT_EQ(p->QueueOf(a.slot), Queue::kMain);
  EXPECT_FALSE(p->InGhost(0));
  EXPECT_TRUE(p->InGhost(100));  // 100 was evicted from small to make room
}

TEST(S3FifoPolicyTest, MainQueueReinsertsWithDecrementedFrequency) {
  auto p = FilledTen();
  for (int i = 0; i < 10; ++i) {
    p->Touch(1);  // capped at 3
  }
  EXPECT_EQ(p->FrequencyOf(1), 3);
  p->Touch(2);
  p->Admit(100);  // slot 0 (fingerprint 100) in small
  p->Touch(0);
  // 100 is promoted, main is over target: its tail is scanned; slot 1
  // (frequency 3) and slot 2 (frequency 1) are reinserted with one less,
  // slot 3 (frequency 0) is evicted.
  const S3FifoPolicy::Admission a = p->Admit(101);
  EXPECT_EQ(a.slot, 3u);
  EXPECT_EQ(p->FrequencyOf(1), 2);
  EXPECT_EQ(p->FrequencyOf(2), 0);
  EXPECT_EQ(p->QueueOf(1), Queue::kMain);
  EXPECT_EQ(p->QueueOf(2), Queue::kMain);
}

TEST(S3FifoPolicyTest, GhostIsABoundedFifo) {
  auto p = FilledTen();  // ghost capacity 9
  EXPECT_EQ(p->ghost_capacity(), 9u);
  for (uint32_t k = 100; k < 130; ++k) {
    p->Admit(k);
  }
  // Evicted into the ghost, in order: 0, 100, 101, ..., 128.
  EXPECT_EQ(p->ghost_size(), 9u);
  EXPECT_FALSE(p->InGhost(0));
  EXPECT_FALSE(p->InGhost(119));
  for (uint32_t k = 120; k < 129; ++k) {
    EXPECT_TRUE(p->InGhost(k)) << k;
  }
}

TEST(S3FifoPolicyTest, NoGhostWhenGhostFractionIsZero) {
  auto p = FilledTen(/*ghost_fraction=*/0);
  p->Admit(100);
  EXPECT_FALSE(p->InGhost(0));
  const S3FifoPolicy::Admission a = p->Admit(0);
  EXPECT_EQ(p->QueueOf(a.slot), Queue::kSmall);
  EXPECT_EQ(p->ghost_size(), 0u);
}

TEST(S3FifoPolicyTest, CapacityOneWorks) {
  auto p = MakePolicy(1);
  EXPECT_EQ(p->Admit(7).slot, 0u);
  p->Touch(0);
  for (uint32_t k = 8; k < 20; ++k) {
    const S3FifoPolicy::Admission a = p->Admit(k);
    EXPECT_EQ(a.slot, 0u);
    EXPECT_TRUE(a.evicted);
    if (k % 3 == 0) {
      p->Touch(0);
    }
  }
  EXPECT_EQ(p->size(), 1u);
}

// Random traces against a model of residency: the policy never loses track
// of a slot, never exceeds capacity and keeps resident keys out of the ghost.
TEST(S3FifoPolicyTest, RandomTraceKeepsInvariants) {
  for (uint32_t capacity : {1u, 7u, 100u}) {
    SCOPED_TRACE(capacity);
    auto p = MakePolicy(capacity);
    std::map<uint32_t, uint32_t> slot_of;  // fingerprint -> slot
    std::vector<int64_t> key_in(capacity, -1);
    std::mt19937 rng(capacity);
    for (int step = 0; step < 100000; ++step) {
      // Skewed keys: small ones are hot.
      const uint32_t r = rng() % 1000;
      const uint32_t key = r < 700 ? r % (capacity * 2 + 1) : r * 31 + 5;
      auto it = slot_of.find(key);
      if (it != slot_of.end()) {
        ASSERT_NE(p->QueueOf(it->second), Queue::kFree);
        p->Touch(it->second);
        continue;
      }
      const bool full = slot_of.size() == capacity;
      const S3FifoPolicy::Admission a = p->Admit(key);
      ASSERT_LT(a.slot, capacity);
      ASSERT_EQ(a.evicted, full);
      if (a.evicted) {
        ASSERT_GE(key_in[a.slot], 0);
        slot_of.erase(static_cast<uint32_t>(key_in[a.slot]));
      } else {
        ASSERT_EQ(key_in[a.slot], -1);
      }
      key_in[a.slot] = key;
      slot_of[key] = a.slot;
      ASSERT_NE(p->QueueOf(a.slot), Queue::kFree);
      ASSERT_EQ(p->size(), slot_of.size());
      ASSERT_EQ(p->small_size() + p->main_size(), p->size());
      ASSERT_LE(p->ghost_size(), p->ghost_capacity());
      if (step % 101 == 0) {
        for (const auto& [k, s] : slot_of) {
          ASSERT_FALSE(p->InGhost(k)) << k;
          ASSERT_NE(p->QueueOf(s), Queue::kFree);
        }
      }
    }
  }
}

TEST(S3FifoPolicyTest, MemoryBytesMatchesTheObject) {
  S3FifoOptions options;
  options.capacity = 1000;
  auto p = MakePolicy(1000);
  EXPECT_EQ(p->memory_bytes(), S3FifoPolicy::MemoryBytes(options));
  // 14 bytes per slot plus the ghost (0.9 x (4 + 8 / 0.7) ~ 14 bytes).
  EXPECT_LT(p->memory_bytes(), 1000u * 30);
}

}  // namespace
}  // namespace mneme::engram
