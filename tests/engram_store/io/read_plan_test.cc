// The planner on its own: deduplication, coalescing, page widening for
// O_DIRECT, op splitting, batching and short-read bookkeeping.

#include "engram_store/io/read_plan.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engram_store/io/row_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/io_test_util.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WriteRandomFile;
using ::testing::HasSubstr;

constexpr uint64_t kSize = 1 << 20;

class ReadPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempPath("plan.bin");
    ASSERT_TRUE(WriteRandomFile(path_, kSize + 100, 1).ok());
    buffered_ = *RowFile::Open(path_, OpenMode::kBuffered);
    direct_ = *RowFile::Open(path_, OpenMode::kDirect);
  }

  ReadPlan Plan(const std::vector<ReadSpan>& spans,
                const CoalesceOptions& options = {}) {
    absl::StatusOr<ReadPlan> plan = PlanReads(spans, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *std::move(plan) : ReadPlan();
  }

  uint8_t* dest(size_t i) { return &dest_[i * 512]; }

  std::string path_;
  std::unique_ptr<RowFile> buffered_;
  std::unique_ptr<RowFile> direct_;
  std::vector<uint8_t> dest_ = std::vector<uint8_t>(size_t{512} * 64);
};

TEST_F(ReadPlanTest, EmptySpansAreDropped) {
  const ReadPlan plan =
      Plan({{nullptr, 0, 0, nullptr}, {buffered_.get(), 9, 0, nullptr}});
  EXPECT_TRUE(plan.extents.empty());
  EXPECT_EQ(plan.spans, 0u);
}

TEST_F(ReadPlanTest, IdenticalSpansAreReadOnceAndCopiedToEach) {
  const ReadPlan plan = Plan({{buffered_.get(), 1000, 264, dest(0)},
                              {buffered_.get(), 1000, 264, dest(1)},
                              {buffered_.get(), 1000, 264, dest(2)}});
  ASSERT_EQ(plan.extents.size(), 1u);
  EXPECT_EQ(plan.extents[0].offset, 1000u);
  EXPECT_EQ(plan.extents[0].length, 264u);
  EXPECT_EQ(plan.extents[0].num_copies, 3u);
  EXPECT_EQ(plan.spans, 3u);
  EXPECT_EQ(plan.unique_spans, 1u);
  ASSERT_EQ(plan.ops.size(), 1u);
  EXPECT_EQ(plan.ops[0].length, 264u);
  EXPECT_EQ(plan.ops[0].required, 264u);
}

TEST_F(ReadPlanTest, NeighboursWithinTheGapAreCoalesced) {
  CoalesceOptions options;
  options.max_gap_bytes = 100;
  // Out of order on purpose: the plan sorts.
  const ReadPlan plan = Plan({{buffered_.get(), 364, 8, dest(0)},     // gap 100
                              {buffered_.get(), 0, 264, dest(1)},     //
                              {buffered_.get(), 473, 8, dest(2)},     // gap 101
                              {buffered_.get(), 264, 100, dest(3)}},  // touches
                             options);
  ASSERT_EQ(plan.extents.size(), 2u);
  EXPECT_EQ(plan.extents[0].offset, 0u);
  EXPECT_EQ(plan.extents[0].length, 372u);
  EXPECT_EQ(plan.extents[0].num_copies, 3u);
  EXPECT_EQ(plan.extents[1].offset, 473u);
  EXPECT_EQ(plan.extents[1].length, 8u);
  // Copies point into their extent.
  EXPECT_EQ(plan.copies[0].extent_offset, 0u);
  EXPECT_EQ(plan.copies[1].extent_offset, 264u);
  EXPECT_EQ(plan.copies[2].extent_offset, 364u);
  EXPECT_EQ(plan.copies[2].dest, dest(0));
}

TEST_F(ReadPlanTest, GapBridgingStopsAtMaxReadBytes) {
  CoalesceOptions options;
  options.max_gap_bytes = 4096;
  options.max_read_bytes = 8192;
  const ReadPlan plan = Plan({{buffered_.get(), 0, 4000, dest(0)},
                              {buffered_.get(), 5000, 3000, dest(1)},  // 8000
                              {buffered_.get(), 9000, 100, dest(2)}},  // 9100
                             options);
  ASSERT_EQ(plan.extents.size(), 2u);
  EXPECT_EQ(plan.extents[0].length, 8000u);
  EXPECT_EQ(plan.extents[1].offset, 9000u);
}

TEST_F(ReadPlanTest, TouchingSpansShareAnExtentSplitIntoOps) {
  CoalesceOptions options;
  options.max_read_bytes = 8192;
  std::vector<ReadSpan> spans;
  spans.reserve(64);
  std::vector<uint8_t> out(size_t{64} * 264);
  for (int i = 0; i < 64; ++i) {
    spans.push_back(
        {buffered_.get(), 100 + 264u * i, 264, &out[size_t{264} * i]});
  }
  const ReadPlan plan = Plan(spans, options);
  ASSERT_EQ(plan.extents.size(), 1u);
  EXPECT_EQ(plan.extents[0].length, 64u * 264);
  ASSERT_EQ(plan.ops.size(), 3u);  // 16896 bytes in 8 KiB reads.
  EXPECT_EQ(plan.ops[0].length, 8192u);
  EXPECT_EQ(plan.ops[1].extent_offset, 8192u);
  EXPECT_EQ(plan.ops[2].length, 16896u - 16384);
  for (const ReadPlan::Op& op : plan.ops) EXPECT_EQ(op.required, op.length);
}

TEST_F(ReadPlanTest, DirectSpansBecomeWholePagesReadOnce) {
  CoalesceOptions options;
  options.max_gap_bytes = 0;
  const ReadPlan plan =
      Plan({{direct_.get(), 100, 264, dest(0)},
            {direct_.get(), 3000, 264, dest(1)},  // Same page.
            {direct_.get(), 4000, 264, dest(2)},  // Crosses.
            {direct_.get(), 20000, 8, dest(3)}},
           options);
  ASSERT_EQ(plan.extents.size(), 2u);
  EXPECT_EQ(plan.extents[0].offset, 0u);
  EXPECT_EQ(plan.extents[0].length, 8192u);
  EXPECT_EQ(plan.extents[0].num_copies, 3u);
  EXPECT_EQ(plan.copies[2].extent_offset, 4000u);
  EXPECT_EQ(plan.extents[1].offset, 16384u);
  EXPECT_EQ(plan.extents[1].length, 4096u);
  EXPECT_EQ(plan.copies[3].extent_offset, 20000u - 16384);
}

TEST_F(ReadPlanTest, DirectLastPageMayEndAtEndOfFile) {
  const uint64_t size = direct_->size();  // kSize + 100: a short last page.
  const ReadPlan plan = Plan({{direct_.get(), size - 8, 8, dest(0)}});
  ASSERT_EQ(plan.ops.size(), 1u);
  EXPECT_EQ(plan.extents[0].offset, kSize);
  EXPECT_EQ(plan.ops[0].length, 4096u);
  EXPECT_EQ(plan.ops[0].required, 100u);
}

TEST_F(ReadPlanTest, InvalidSpansNameTheSpanAndFile) {
  CoalesceOptions options;
  absl::StatusOr<ReadPlan> plan = PlanReads(
      {{{buffered_.get(), 0, 8, dest(0)}, {nullptr, 0, 8, dest(1)}}}, options);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("span 1"));

  plan = PlanReads({{{buffered_.get(), 0, 8, nullptr}}}, options);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);

  plan = PlanReads({{{buffered_.get(), kSize + 90, 11, dest(0)}}}, options);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr(path_));

  std::vector<uint8_t> big(options.max_read_bytes + 1);
  plan = PlanReads({{{buffered_.get(), 0, big.size(), big.data()}}}, options);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CoalesceOptionsTest, Validation) {
  EXPECT_TRUE(ValidateCoalesceOptions({}, "x").ok());
  CoalesceOptions options;
  options.max_read_bytes = 5000;
  absl::Status status = ValidateCoalesceOptions(options, "opts");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("opts.max_read_bytes"));
  options = {};
  options.max_gap_bytes = options.max_read_bytes + 1;
  status = ValidateCoalesceOptions(options, "opts");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("opts.max_gap_bytes"));
}

TEST(BatchExtentsTest, GroupsWholeExtentsByOps) {
  ReadPlan plan;
  for (uint32_t ops : {1, 1, 1, 5, 1, 1}) {
    ReadPlan::Extent extent;
    extent.num_ops = ops;
    plan.extents.push_back(extent);
  }
  EXPECT_THAT(BatchExtents(plan, 2), ::testing::ElementsAre(0, 2, 3, 4, 6));
  EXPECT_THAT(BatchExtents(plan, 100), ::testing::ElementsAre(0, 6));
  EXPECT_THAT(BatchExtents(ReadPlan(), 4), ::testing::ElementsAre(0));
}

TEST(OpCursorTest, BufferedShortReadsResumeWhereTheyStopped) {
  ReadPlan::Op op;
  op.length = op.required = 1000;
  OpCursor cursor(op, 1);
  EXPECT_EQ(cursor.Advance(300), OpCursor::Step::kResubmit);
  EXPECT_EQ(cursor.NextOffset(), 300u);
  EXPECT_EQ(cursor.NextLength(), 700u);
  EXPECT_EQ(cursor.Advance(700), OpCursor::Step::kComplete);
}

TEST(OpCursorTest, BufferedZeroBytesIsEndOfFile) {
  ReadPlan::Op op;
  op.length = op.required = 1000;
  OpCursor cursor(op, 1);
  EXPECT_EQ(cursor.Advance(10), OpCursor::Step::kResubmit);
  EXPECT_EQ(cursor.Advance(0), OpCursor::Step::kEndOfFile);
  EXPECT_EQ(cursor.done(), 10u);
}

TEST(OpCursorTest, DirectResumesFromAnAlignedOffset) {
  ReadPlan::Op op;
  op.length = 16384;
  op.required = 12000;
  OpCursor cursor(op, 4096);
  // A short read ending mid-page: the next read restarts at that page.
  EXPECT_EQ(cursor.Advance(5000), OpCursor::Step::kResubmit);
  EXPECT_EQ(cursor.NextOffset(), 4096u);
  EXPECT_EQ(cursor.NextLength(), 12288u);
  // Reaching `required` is enough even if the file ends before `length`.
  EXPECT_EQ(cursor.Advance(8000), OpCursor::Step::kComplete);
}

TEST(OpCursorTest, DirectReadThatAddsNothingIsEndOfFile) {
  ReadPlan::Op op;
  op.length = 8192;
  op.required = 8000;
  OpCursor cursor(op, 4096);
  EXPECT_EQ(cursor.Advance(5000), OpCursor::Step::kResubmit);
  // Re-reading the page gives the same 904 bytes: the file ends at 5000.
  EXPECT_EQ(cursor.Advance(904), OpCursor::Step::kEndOfFile);
}

}  // namespace
}  // namespace mneme::engram
