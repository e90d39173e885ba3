#include "model/layers/attention_keys.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/dcp_merge.h"

namespace mneme::model {
namespace {

// A key as what it is: a window position or a compressed entry.
using Key = std::pair<char, int64_t>;

// Whether rank `rank` of `size` keeps index i with `interleave` in a row:
// the DCP rule written out here, not taken from DcpLayout.
bool Keeps(int rank, int size, int interleave, int64_t i) {
  return size == 1 || (i / interleave) % size == rank;
}

// The keys query p attends, by definition: its window positions, oldest
// first, then its selected entries, those the rank keeps.
std::vector<Key> ExpectedKeys(int rank, int size, int interleave, int window,
                              int64_t p, const std::vector<int32_t>& sel) {
  std::vector<Key> keys;
  for (int64_t q = std::max<int64_t>(0, p - window + 1); q <= p; ++q) {
    if (Keeps(rank, size, interleave, q)) keys.emplace_back('w', q);
  }
  for (const int32_t e : sel) {
    if (Keeps(rank, size, interleave, e)) keys.emplace_back('e', e);
  }
  return keys;
}

struct Case {
  int rank, size, interleave, window;
  int64_t p0, n;
  std::vector<std::vector<int32_t>> selected;
};

std::string Describe(const Case& c) {
  return absl::StrCat("rank ", c.rank, "/", c.size, " interleave ",
                      c.interleave, " window ", c.window, " p0 ", c.p0, " n ",
                      c.n, " selected rows ", c.selected.size());
}

void CheckChunk(const Case& c) {
  SCOPED_TRACE(Describe(c));
  const DcpLayout dcp{
      .rank = c.rank, .size = c.size, .interleave = c.interleave};
  const ChunkKeys k = ListChunkKeys(dcp, c.window, c.p0, c.n, c.selected);
  // What each key number stands for.
  std::vector<Key> key_of;
  for (size_t i = 0; i < k.earlier.size(); ++i) {
    key_of.emplace_back('w', k.earlier[i]);
    EXPECT_LT(k.earlier[i], c.p0);
    if (i > 0) {
      EXPECT_LT(k.earlier[i - 1], k.earlier[i]);
    }
  }
  for (size_t i = 0; i < k.own.size(); ++i) {
    ASSERT_GE(k.own[i], 0);
    ASSERT_LT(k.own[i], c.n);
    key_of.emplace_back('w', c.p0 + k.own[i]);
    if (i > 0) {
      EXPECT_LT(k.own[i - 1], k.own[i]);
    }
  }
  for (const int32_t e : k.entries) key_of.emplace_back('e', e);
  ASSERT_EQ(static_cast<int64_t>(key_of.size()), k.keys());
  EXPECT_EQ(std::set<Key>(key_of.begin(), key_of.end()).size(), key_of.size())
      << "a key listed twice";

  size_t most = 0;
  for (int64_t j = 0;
       j < std::min<int64_t>(c.n, static_cast<int64_t>(c.selected.size()));
       ++j) {
    most = std::max(most, c.selected[j].size());
  }
  ASSERT_EQ(k.width, c.window + static_cast<int>(most));
  ASSERT_EQ(k.idx.size(), static_cast<size_t>(c.n * k.width));
  std::vector<bool> used(key_of.size(), false);
  for (int64_t j = 0; j < c.n; ++j) {
    const std::vector<int32_t> none;
    const std::vector<int32_t>& sel =
        j < static_cast<int64_t>(c.selected.size()) ? c.selected[j] : none;
    const std::vector<Key> want =
        ExpectedKeys(c.rank, c.size, c.interleave, c.window, c.p0 + j, sel);
    std::vector<Key> got;
    int64_t i = 0;
    for (; i < k.width && k.idx[j * k.width + i] >= 0; ++i) {
      const int32_t key = k.idx[j * k.width + i];
      ASSERT_LT(key, k.keys());
      got.push_back(key_of[key]);
      used[key] = true;
    }
    for (; i < k.width; ++i) {
      EXPECT_EQ(k.idx[j * k.width + i], -1) << "query " << j << " slot " << i;
    }
    EXPECT_EQ(got, want) << "query " << j;
  }
  for (size_t i = 0; i < used.size(); ++i) {
    EXPECT_TRUE(used[i]) << "key " << i << " is attended by no query";
  }
}

TEST(ListChunkKeysTest, HandPickedChunk) {
  // Window 3, positions 5..7; query 0 selects entries 1 and 0, query 1
  // selects 0 again, query 2 nothing.
  const ChunkKeys k = ListChunkKeys(DcpLayout{}, 3, 5, 3, {{1, 0}, {0}});
  EXPECT_EQ(k.earlier, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(k.own, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(k.entries, (std::vector<int32_t>{1, 0}));
  ASSERT_EQ(k.width, 5);
  EXPECT_EQ(k.idx, (std::vector<int32_t>{0, 1, 2, 5, 6,   //
                                         1, 2, 3, 6, -1,  //
                                         2, 3, 4, -1, -1}));
}

TEST(ListChunkKeysTest, MatchesTheDefinitionWithAndWithoutDcp) {
  std::mt19937 rng(11);
  int cases = 0;
  for (const auto& [size, interleave] :
       std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {3, 4}, {4, 2}}) {
    for (int rank = 0; rank < size; ++rank) {
      for (const int window : {1, 4, 8}) {
        for (const int64_t p0 : {0, 2, 7, 40}) {
          for (const int64_t n : {1, 3, 12}) {
            Case c{rank, size, interleave, window, p0, n, {}};
            // Entries visible to the chunk: one per 2 tokens.
            const int64_t entries = (p0 + n) / 2;
            std::uniform_int_distribution<int> rows(0, static_cast<int>(n) + 2);
            c.selected.resize(rows(rng));
            for (auto& s : c.selected) {
              for (int64_t e = 0; e < entries; ++e) {
                if (rng() % 3 == 0) s.push_back(static_cast<int32_t>(e));
              }
            }
            CheckChunk(c);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 10 * 3 * 4 * 3);
}

TEST(ListChunkKeysTest, ForEachKeyOfQueryVisitsTheKeptKeysInOrder) {
  const DcpLayout dcp{.rank = 1, .size = 2, .interleave = 2};
  std::vector<Key> got;
  ForEachKeyOfQuery(
      dcp, 6, 9, std::vector<int32_t>{0, 2, 3, 6, 7},
      [&](int64_t q) { got.emplace_back('w', q); },
      [&](int32_t e) { got.emplace_back('e', e); });
  EXPECT_EQ(got,
            (std::vector<Key>{
                {'w', 6}, {'w', 7}, {'e', 2}, {'e', 3}, {'e', 6}, {'e', 7}}));
  EXPECT_EQ(got, ExpectedKeys(1, 2, 2, 6, 9, {0, 2, 3, 6, 7}));
}

TEST(ChoiceGroupEndsTest, HandPickedGroups) {
  EXPECT_TRUE(ChoiceGroupEnds({}, 100).empty());
  EXPECT_EQ(ChoiceGroupEnds({5}, 100), (std::vector<size_t>{1}));
  // One long context among short ones is chosen alone.
  EXPECT_EQ(ChoiceGroupEnds({1, 1, 1, 100}, 1000), (std::vector<size_t>{3, 4}));
  // The padding may equal the scores, not exceed them: 3 x 4 = 2 x 6, then
  // 3 x 5 > 2 x 7.
  EXPECT_EQ(ChoiceGroupEnds({1, 1, 4}, 1000), (std::vector<size_t>{3}));
  EXPECT_EQ(ChoiceGroupEnds({1, 1, 5}, 1000), (std::vector<size_t>{2, 3}));
  // Close counts go together.
  EXPECT_EQ(ChoiceGroupEnds({4, 5, 6, 7, 8}, 1000), (std::vector<size_t>{5}));
  // The bound on scores held at once: 2 x 10 <= 25 < 3 x 10.
  EXPECT_EQ(ChoiceGroupEnds({10, 10, 10, 10}, 25), (std::vector<size_t>{2, 4}));
  // A row above the bound is still chosen, alone.
  EXPECT_EQ(ChoiceGroupEnds({100, 100}, 50), (std::vector<size_t>{1, 2}));
}

TEST(ChoiceGroupEndsTest, GroupsAreWithinTheRulesAndAsLargeAsTheyAllow) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> totals(1 + rng() % 40);
    for (int64_t& t : totals) {
      t = 1 + static_cast<int64_t>(rng() % (trial % 2 == 0 ? 20 : 5000));
    }
    std::sort(totals.begin(), totals.end());
    const int64_t max_floats = 1 + static_cast<int64_t>(rng() % 20000);
    const std::vector<size_t> ends = ChoiceGroupEnds(totals, max_floats);
    ASSERT_FALSE(ends.empty());
    ASSERT_EQ(ends.back(), totals.size());
    // Whether rows [b, e) may be one group.
    const auto fits = [&](size_t b, size_t e) {
      if (e - b == 1) return true;
      int64_t sum = 0;
      for (size_t i = b; i < e; ++i) sum += totals[i];
      const int64_t held = static_cast<int64_t>(e - b) * totals[e - 1];
      return held <= max_floats && held <= 2 * sum;
    };
    size_t begin = 0;
    for (const size_t end : ends) {
      ASSERT_GT(end, begin);
      EXPECT_TRUE(fits(begin, end)) << "trial " << trial;
      if (end < totals.size()) {
        EXPECT_FALSE(fits(begin, end + 1)) << "trial " << trial;
      }
      begin = end;
    }
  }
}

}  // namespace
}  // namespace mneme::model
