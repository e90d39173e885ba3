#include "engram_store/hashing/column_split.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "checkpoint/engram_config.h"
#include "engram_store/hashing/hash_layout.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

HashLayout V41Layout() {
  checkpoint::EngramConfig config;
  config.layer_ids = {1, 14};
  config.num_embeddings = {384006168, 384016682};
  config.max_ngram_size = 4;
  config.n_heads = 8;
  config.vocab_size = 16000000;
  config.compressed_vocab_size = 99092;
  return *HashLayout::Create(config);
}

struct SplitCase {
  ColumnSplit split;
  int tp_size;
};

class ColumnSplitTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(ColumnSplitTest, EveryColumnExactlyOnceAndRangesDisjoint) {
  const HashLayout layout = V41Layout();
  const auto [split, tp] = GetParam();
  std::vector<int> owner(layout.num_columns(), -1);
  for (size_t layer = 0; layer < layout.layers().size(); ++layer) {
    std::vector<RowRange> all;
    for (int rank = 0; rank < tp; ++rank) {
      absl::StatusOr<RankAssignment> a = AssignRank(layout, split, tp, rank);
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->rank, rank);
      EXPECT_EQ(a->columns.size(), static_cast<size_t>(24 / tp));
      EXPECT_TRUE(std::is_sorted(a->columns.begin(), a->columns.end()));
      ASSERT_EQ(a->layers.size(), layout.layers().size());
      const RankAssignment::LayerRows& rows = a->layers[layer];
      EXPECT_EQ(rows.layer_id, layout.layers()[layer].layer_id);
      ASSERT_EQ(rows.column_rows.size(), a->columns.size());
      int64_t total = 0;
      for (size_t i = 0; i < a->columns.size(); ++i) {
        const int c = a->columns[i];
        if (layer == 0) {
          EXPECT_EQ(owner[c], -1) << "column " << c << " assigned twice";
          owner[c] = rank;
        }
        const LayerHashLayout& l = layout.layers()[layer];
        EXPECT_EQ(rows.column_rows[i],
                  (RowRange{l.offsets[c], l.offsets[c] + l.primes[c]}));
        total += rows.column_rows[i].size();
        all.push_back(rows.column_rows[i]);
      }
      EXPECT_EQ(rows.num_rows, total);
    }
    // Ranges of all ranks tile [0, num_rows) without overlap.
    std::sort(all.begin(), all.end(), [](const RowRange& a, const RowRange& b) {
      return a.begin < b.begin;
    });
    int64_t next = 0;
    for (const RowRange& r : all) {
      EXPECT_EQ(r.begin, next);
      next = r.end;
    }
    EXPECT_EQ(next, layout.layers()[layer].num_rows);
  }
  for (int c = 0; c < 24; ++c) EXPECT_NE(owner[c], -1) << c;
}

TEST_P(ColumnSplitTest, OtherRanksDoNotReadRankZerosRows) {
  // The field bug: ranks 1..tp-1 silently read rank 0's rows.
  const HashLayout layout = V41Layout();
  const auto [split, tp] = GetParam();
  const RankAssignment zero = *AssignRank(layout, split, tp, 0);
  if (tp == 1) {
    // The only rank reads every column.
    EXPECT_EQ(zero.columns.size(), 24u);
    return;
  }
  for (int rank = 1; rank < tp; ++rank) {
    const RankAssignment other = *AssignRank(layout, split, tp, rank);
    EXPECT_NE(other.columns, zero.columns);
    for (size_t layer = 0; layer < layout.layers().size(); ++layer) {
      for (const RowRange& mine : other.layers[layer].column_rows) {
        for (const RowRange& theirs : zero.layers[layer].column_rows) {
          EXPECT_TRUE(mine.end <= theirs.begin || theirs.end <= mine.begin)
              << "rank " << rank << " overlaps rank 0";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Splits, ColumnSplitTest,
    ::testing::Values(SplitCase{ColumnSplit::kContiguous, 1},
                      SplitCase{ColumnSplit::kContiguous, 2},
                      SplitCase{ColumnSplit::kContiguous, 3},
                      SplitCase{ColumnSplit::kContiguous, 4},
                      SplitCase{ColumnSplit::kContiguous, 8},
                      SplitCase{ColumnSplit::kContiguous, 24},
                      SplitCase{ColumnSplit::kStrided, 1},
                      SplitCase{ColumnSplit::kStrided, 2},
                      SplitCase{ColumnSplit::kStrided, 4},
                      SplitCase{ColumnSplit::kStrided, 8}));

TEST(ColumnSplitTest, ContiguousBlocks) {
  EXPECT_EQ(*RankColumns(ColumnSplit::kContiguous, 24, 8, 4, 0),
            (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(*RankColumns(ColumnSplit::kContiguous, 24, 8, 4, 3),
            (std::vector<int>{18, 19, 20, 21, 22, 23}));
  const HashLayout layout = V41Layout();
  const RankAssignment a = *AssignRank(layout, ColumnSplit::kContiguous, 4, 1);
  const std::vector<RowRange> merged =
      CoalesceRowRanges(a.layers[0].column_rows);
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].begin, layout.layers()[0].offsets[6]);
  EXPECT_EQ(merged[0].end, layout.layers()[0].offsets[12]);
}

TEST(ColumnSplitTest, StridedBalancesOrders) {
  const HashLayout layout = V41Layout();
  EXPECT_EQ(*RankColumns(ColumnSplit::kStrided, 24, 8, 4, 1),
            (std::vector<int>{1, 5, 9, 13, 17, 21}));
  for (int tp : {1, 2, 4, 8}) {
    for (int rank = 0; rank < tp; ++rank) {
      const std::vector<int> columns =
          *RankColumns(ColumnSplit::kStrided, 24, 8, tp, rank);
      std::map<int, int> per_order;
      for (int c : columns) ++per_order[layout.OrderOfColumn(c)];
      EXPECT_EQ(per_order,
                (std::map<int, int>{{2, 8 / tp}, {3, 8 / tp}, {4, 8 / tp}}))
          << "tp " << tp << " rank " << rank;
    }
  }
  // Contiguous at TP4 does not: rank 0 holds only 2-gram heads.
  const std::vector<int> contiguous =
      *RankColumns(ColumnSplit::kContiguous, 24, 8, 4, 0);
  for (int c : contiguous) {
    EXPECT_EQ(layout.OrderOfColumn(c), 2);
  }
}

TEST(ColumnSplitTest, Parse) {
  EXPECT_EQ(*ParseColumnSplit("contiguous"), ColumnSplit::kContiguous);
  EXPECT_EQ(*ParseColumnSplit("strided"), ColumnSplit::kStrided);
  EXPECT_EQ(ParseColumnSplit("round-robin").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_STREQ(ColumnSplitName(ColumnSplit::kStrided), "strided");
  EXPECT_STREQ(ColumnSplitName(ColumnSplit::kContiguous), "contiguous");
}

TEST(ColumnSplitTest, InvalidSplitsAreInvalidArgument) {
  const HashLayout layout = V41Layout();
  // 5 does not divide 24 columns; 3 does not divide 8 heads.
  absl::StatusOr<RankAssignment> a =
      AssignRank(layout, ColumnSplit::kContiguous, 5, 0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "5")) << a.status();
  EXPECT_EQ(AssignRank(layout, ColumnSplit::kStrided, 3, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignRank(layout, ColumnSplit::kStrided, 4, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignRank(layout, ColumnSplit::kStrided, 4, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignRank(layout, ColumnSplit::kStrided, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignRank(layout, ColumnSplit::kUnspecified, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RankColumns(ColumnSplit::kContiguous, 10, 4, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CoalesceRowRangesTest, MergesTouchingAndOverlapping) {
  const std::vector<RowRange> ranges = {
      {10, 20}, {0, 5}, {5, 8}, {15, 25}, {30, 31}};
  EXPECT_EQ(CoalesceRowRanges(ranges),
            (std::vector<RowRange>{{0, 8}, {10, 25}, {30, 31}}));
  EXPECT_TRUE(CoalesceRowRanges({}).empty());
}

}  // namespace
}  // namespace mneme::engram
