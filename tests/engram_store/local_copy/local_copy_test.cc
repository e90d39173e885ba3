// The sparse local copy end to end: for every TP size, column split, rank and
// row format, Localize() then LocalCopy::Open() hold exactly the rows the
// rank serves, byte-identical to the checkpoint's.
#include "engram_store/local_copy/local_copy.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engram_store/local_copy/local_copy_writer.h"
#include "gtest/gtest.h"
#include "tests/engram_store/local_copy/local_copy_test_util.h"
#include "tests/testing/subprocess.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::OneRank;
using ::mneme::engram::testing::OpenCheckpoint;
using ::mneme::engram::testing::ServedRows;
using ::mneme::engram::testing::SharedCheckpointDir;

// Small ranges and chunks, so that every column spans several manifest
// entries and every entry several chunks (whose size is not a multiple of a
// row).
LocalizeOptions SmallStepOptions(const std::string& out,
                                 const LocalCopyTarget& target) {
  LocalizeOptions options;
  options.out_dir = out;
  options.target = target;
  options.max_range_bytes = 64 << 10;
  options.chunk_bytes = 10000;
  options.threads = 3;
  return options;
}

std::string NewOutDir() {
  return ::mneme::testing::MakeTempDir("copy") + "/local";
}

uint64_t FileBytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// (format, split, tp, rank)
using RankParam = std::tuple<formats::RowFormat, ColumnSplit, int, int>;

class LocalCopyRankTest : public ::testing::TestWithParam<RankParam> {};

TEST_P(LocalCopyRankTest, HoldsExactlyTheServedRowsByteIdentical) {
  const auto [format, split, tp, rank] = GetParam();
  auto checkpoint = OpenCheckpoint(SharedCheckpointDir(format));
  ASSERT_NE(checkpoint, nullptr);
  const LocalCopyTarget target = OneRank(tp, rank, split);
  const std::string out = NewOutDir();
  absl::StatusOr<LocalizeSummary> summary =
      Localize(*checkpoint, SmallStepOptions(out, target));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->ranges_copied, summary->ranges);
  EXPECT_EQ(summary->ranges_reused, 0);

  absl::StatusOr<std::unique_ptr<LocalCopy>> copy =
      LocalCopy::Open(out, *checkpoint, target, {.verify_checksums = true});
  ASSERT_TRUE(copy.ok()) << copy.status();

  int64_t total_rows = 0;
  for (size_t i = 0; i < checkpoint->tables().size(); ++i) {
    const checkpoint::EngramTableLocation& table = checkpoint->tables()[i];
    const std::vector<bool> served =
        ServedRows(*checkpoint, i, tp, rank, split);
    std::vector<int64_t> ids;
    for (int64_t row = 0; row < table.rows; ++row) {
      const std::optional<uint64_t> offset = (*copy)->Locate(table.layer, row);
      ASSERT_EQ(offset.has_value(), served[row])
          << "layer " << table.layer << " row " << row;
      if (offset.has_value()) ids.push_back(row);
    }
    ASSERT_FALSE(ids.empty());
    const size_t row_bytes = formats::RowBytes(format);
    std::vector<uint8_t> from_copy(ids.size() * row_bytes);
    std::vector<uint8_t> from_source(ids.size() * row_bytes);
    ASSERT_TRUE(
        (*copy)->ReadRawRows(table.layer, ids, absl::MakeSpan(from_copy)).ok());
    ASSERT_TRUE(
        checkpoint->ReadRawRows(table.layer, ids, absl::MakeSpan(from_source))
            .ok());
    EXPECT_TRUE(from_copy == from_source) << "layer " << table.layer;

    // The data file is the served rows, packed in row order, and nothing
    // else.
    const std::string data =
        testing::ReadFileOrEmpty(*(*copy)->DataPath(table.layer));
    ASSERT_EQ(data.size(), ids.size() * row_bytes);
    EXPECT_EQ(0, std::memcmp(data.data(), from_source.data(), data.size()));
    EXPECT_EQ(summary->layers[i].rows, static_cast<int64_t>(ids.size()));
    EXPECT_EQ((*copy)->Layer(table.layer)->covered_rows(),
              static_cast<int64_t>(ids.size()));
    total_rows += static_cast<int64_t>(ids.size());

    // The field bug: a reader ignoring the rank's row offset served rank 0's
    // rows on every rank. Rank r's copy holds none of rank 0's rows, and its
    // first bytes are its own first row, not row 0.
    if (rank != 0) {
      const std::vector<bool> rank0 = ServedRows(*checkpoint, i, tp, 0, split);
      for (int64_t row = 0; row < table.rows; ++row) {
        if (rank0[row]) {
          ASSERT_FALSE((*copy)->Locate(table.layer, row).has_value()) << row;
        }
      }
      EXPECT_NE(ids.front(), 0);
      std::vector<int64_t> zero = {0};
      std::vector<uint8_t> unused(row_bytes);
      EXPECT_EQ((*copy)
                    ->ReadRawRows(table.layer, zero, absl::MakeSpan(unused))
                    .code(),
                absl::StatusCode::kOutOfRange);
    }
  }
  EXPECT_EQ(summary->rows, total_rows);
  // Rows outside the table and layers without a table are not covered.
  EXPECT_FALSE((*copy)->Locate(1, -1).has_value());
  EXPECT_FALSE((*copy)->Locate(1, checkpoint->tables()[0].rows).has_value());
  EXPECT_FALSE((*copy)->Locate(2, 0).has_value());
  EXPECT_EQ((*copy)->DataFd(2), -1);
  EXPECT_EQ((*copy)->DataPath(2).status().code(), absl::StatusCode::kNotFound);
}

std::vector<RankParam> AllRanks() {
  std::vector<RankParam> params;
  for (formats::RowFormat format :
       {formats::RowFormat::kFp8, formats::RowFormat::kNvfp4}) {
    for (ColumnSplit split :
         {ColumnSplit::kStrided, ColumnSplit::kContiguous}) {
      for (int tp : {1, 2, 4}) {
        for (int rank = 0; rank < tp; ++rank) {
          params.emplace_back(format, split, tp, rank);
        }
      }
    }
  }
  return params;
}

std::string RankParamName(const ::testing::TestParamInfo<RankParam>& info) {
  const auto [format, split, tp, rank] = info.param;
  return absl::StrCat(formats::RowFormatName(format), "_",
                      ColumnSplitName(split), "_tp", tp, "_rank", rank);
}

INSTANTIATE_TEST_SUITE_P(AllTargets, LocalCopyRankTest,
                         ::testing::ValuesIn(AllRanks()), RankParamName);

// (format, split, tp)
using GroupParam = std::tuple<formats::RowFormat, ColumnSplit, int>;

class LocalCopyGroupTest : public ::testing::TestWithParam<GroupParam> {};

TEST_P(LocalCopyGroupTest, RanksTogetherCoverEveryRowExactlyOnce) {
  const auto [format, split, tp] = GetParam();
  auto checkpoint = OpenCheckpoint(SharedCheckpointDir(format));
  ASSERT_NE(checkpoint, nullptr);
  std::vector<std::unique_ptr<LocalCopy>> copies;
  for (int rank = 0; rank < tp; ++rank) {
    const LocalCopyTarget target = OneRank(tp, rank, split);
    const std::string out = NewOutDir();
    ASSERT_TRUE(Localize(*checkpoint, SmallStepOptions(out, target)).ok());
    absl::StatusOr<std::unique_ptr<LocalCopy>> copy =
        LocalCopy::Open(out, *checkpoint, target);
    ASSERT_TRUE(copy.ok()) << copy.status();
    copies.push_back(*std::move(copy));
  }
  for (const checkpoint::EngramTableLocation& table : checkpoint->tables()) {
    uint64_t bytes = 0;
    for (const auto& copy : copies) {
      bytes += FileBytes(*copy->DataPath(table.layer));
    }
    EXPECT_EQ(bytes,
              static_cast<uint64_t>(table.rows) * formats::RowBytes(format));
    for (int64_t row = 0; row < table.rows; ++row) {
      int holders = 0;
      for (const auto& copy : copies) {
        holders += copy->Locate(table.layer, row).has_value() ? 1 : 0;
      }
      ASSERT_EQ(holders, 1) << "layer " << table.layer << " row " << row;
    }
  }
}

std::string GroupParamName(const ::testing::TestParamInfo<GroupParam>& info) {
  const auto [format, split, tp] = info.param;
  return absl::StrCat(formats::RowFormatName(format), "_",
                      ColumnSplitName(split), "_tp", tp);
}

INSTANTIATE_TEST_SUITE_P(
    AllGroups, LocalCopyGroupTest,
    ::testing::Combine(
        ::testing::Values(formats::RowFormat::kFp8, formats::RowFormat::kNvfp4),
        ::testing::Values(ColumnSplit::kStrided, ColumnSplit::kContiguous),
        ::testing::Values(1, 2, 4)),
    GroupParamName);

TEST(LocalCopyTest, ACopyOfSeveralRanksHoldsTheirUnion) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const LocalCopyTarget target{
      .tp_size = 4, .ranks = {0, 2}, .split = ColumnSplit::kStrided};
  const std::string out = NewOutDir();
  ASSERT_TRUE(Localize(*checkpoint, SmallStepOptions(out, target)).ok());
  absl::StatusOr<std::unique_ptr<LocalCopy>> copy =
      LocalCopy::Open(out, *checkpoint, target);
  ASSERT_TRUE(copy.ok()) << copy.status();
  for (size_t i = 0; i < checkpoint->tables().size(); ++i) {
    const checkpoint::EngramTableLocation& table = checkpoint->tables()[i];
    const auto r0 = ServedRows(*checkpoint, i, 4, 0, ColumnSplit::kStrided);
    const auto r2 = ServedRows(*checkpoint, i, 4, 2, ColumnSplit::kStrided);
    for (int64_t row = 0; row < table.rows; ++row) {
      ASSERT_EQ((*copy)->Locate(table.layer, row).has_value(),
                r0[row] || r2[row])
          << row;
    }
  }
  // A store of rank 0 alone does not take the two-rank copy.
  EXPECT_EQ(
      LocalCopy::Open(out, *checkpoint, OneRank(4, 0, ColumnSplit::kStrided))
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST(LocalCopyTest, LocateGivesPackedOffsets) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kNvfp4));
  ASSERT_NE(checkpoint, nullptr);
  const LocalCopyTarget target = OneRank(4, 3, ColumnSplit::kStrided);
  const std::string out = NewOutDir();
  ASSERT_TRUE(Localize(*checkpoint, SmallStepOptions(out, target)).ok());
  absl::StatusOr<std::unique_ptr<LocalCopy>> copy =
      LocalCopy::Open(out, *checkpoint, target);
  ASSERT_TRUE(copy.ok()) << copy.status();
  for (const LocalCopyLayer& layer : (*copy)->manifest().layers) {
    uint64_t expected = 0;
    for (const LocalCopyRange& range : layer.ranges) {
      EXPECT_EQ((*copy)->Locate(layer.layer, range.first_row), expected);
      EXPECT_EQ((*copy)->Locate(layer.layer, range.end_row() - 1),
                expected + (range.count - 1) * layer.row_bytes());
      expected += range.count * layer.row_bytes();
    }
    EXPECT_EQ(expected, layer.data_bytes());
  }
}

}  // namespace
}  // namespace mneme::engram
