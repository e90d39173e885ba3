#include "engram_store/cache/tag_table.h"

#include <cstdint>
#include <map>
#include <random>
#include <utility>

#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

uint32_t FindValue(const TagTable& t, uint32_t hash, uint32_t value) {
  return t.Find(hash, [value](uint32_t v) { return v == value; });
}

TEST(TagTableTest, InsertFindErase) {
  TagTable t(10, 0.7);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.Find(5, [](uint32_t) { return true; }), TagTable::kNotFound);
  t.Insert(5, 50);
  t.Insert(6, 60);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(FindValue(t, 5, 50), 50u);
  EXPECT_EQ(FindValue(t, 6, 60), 60u);
  EXPECT_EQ(FindValue(t, 5, 60), TagTable::kNotFound);
  EXPECT_TRUE(t.Erase(5, 50));
  EXPECT_FALSE(t.Erase(5, 50));
  EXPECT_FALSE(t.Erase(6, 61));
  EXPECT_EQ(FindValue(t, 5, 50), TagTable::kNotFound);
  EXPECT_EQ(FindValue(t, 6, 60), 60u);
  EXPECT_EQ(t.size(), 1u);
}

TEST(TagTableTest, SharedHashesAreDisambiguatedByThePredicate) {
  TagTable t(8, 0.5);
  for (uint32_t v = 0; v < 8; ++v) {
    t.Insert(42, v);
  }
  for (uint32_t v = 0; v < 8; ++v) {
    EXPECT_EQ(FindValue(t, 42, v), v);
  }
  EXPECT_TRUE(t.Erase(42, 3));
  for (uint32_t v = 0; v < 8; ++v) {
    EXPECT_EQ(FindValue(t, 42, v), v == 3 ? TagTable::kNotFound : v);
  }
}

TEST(TagTableTest, ValueZeroAndLargestValueAreStorable) {
  TagTable t(2, 0.9);
  t.Insert(0, 0);
  t.Insert(0xFFFFFFFFu, 0xFFFFFFFEu);
  EXPECT_EQ(FindValue(t, 0, 0), 0u);
  EXPECT_EQ(FindValue(t, 0xFFFFFFFFu, 0xFFFFFFFEu), 0xFFFFFFFEu);
}

TEST(TagTableTest, MemoryIsFixedAndMatchesMemoryBytes) {
  TagTable t(1000, 0.7);
  EXPECT_EQ(t.memory_bytes(), TagTable::MemoryBytes(1000, 0.7));
  EXPECT_EQ(t.memory_bytes(), 1429u * 8);  // ceil(1000 / 0.7) buckets
}

// Random churn at full load against a reference, with hashes drawn from a
// small range so clusters wrap around the end of the bucket array and
// backward-shift deletion is exercised hard.
TEST(TagTableTest, RandomChurnMatchesReference) {
  for (uint32_t hash_range : {4u, 64u, 1u << 20}) {
    SCOPED_TRACE(hash_range);
    constexpr uint32_t kMax = 500;
    TagTable t(kMax, 0.9);
    std::multimap<uint32_t, uint32_t> ref;  // hash -> value
    std::mt19937 rng(hash_range);
    uint32_t next_value = 0;
    for (int step = 0; step < 200000; ++step) {
      const bool insert = ref.size() < kMax && (ref.empty() || rng() % 2 == 0);
      if (insert) {
        // Spread hashes over the whole 32-bit range but with few distinct
        // values.
        const uint32_t h = (rng() % hash_range) * 2654435761u;
        const uint32_t v = next_value++ % 0xFFFFFFF0u;
        t.Insert(h, v);
        ref.emplace(h, v);
      } else {
        auto it = ref.begin();
        std::advance(it, rng() % ref.size());
        ASSERT_TRUE(t.Erase(it->first, it->second));
        ref.erase(it);
      }
      ASSERT_EQ(t.size(), ref.size());
      if (step % 997 == 0) {
        for (const auto& [h, v] : ref) {
          ASSERT_EQ(FindValue(t, h, v), v);
        }
      }
    }
    for (const auto& [h, v] : ref) {
      ASSERT_EQ(FindValue(t, h, v), v);
    }
  }
}

}  // namespace
}  // namespace mneme::engram
