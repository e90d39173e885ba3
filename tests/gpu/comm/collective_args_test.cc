#include "gpu/comm/collective_args.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(CollectiveArgsTest, GroupArgs) {
  EXPECT_TRUE(CheckGroupArgs(0, 1, absl::Seconds(1)).ok());
  EXPECT_TRUE(CheckGroupArgs(3, 4, absl::Milliseconds(1)).ok());
  EXPECT_EQ(CheckGroupArgs(0, 0, absl::Seconds(1)).code(), kInvalid);
  EXPECT_EQ(CheckGroupArgs(-1, 2, absl::Seconds(1)).code(), kInvalid);
  EXPECT_EQ(CheckGroupArgs(2, 2, absl::Seconds(1)).message(),
            "rank must be in [0, size); got 2 of 2");
  EXPECT_EQ(CheckGroupArgs(0, 2, absl::ZeroDuration()).code(), kInvalid);
  EXPECT_EQ(CheckGroupArgs(0, 2, -absl::Seconds(1)).code(), kInvalid);
}

TEST(CollectiveArgsTest, CountsAndBuffers) {
  float x = 0.0f;
  EXPECT_TRUE(CheckCollectiveArgs(0, 1, {nullptr}).ok());
  EXPECT_TRUE(CheckCollectiveArgs(1, 4, {&x, &x}).ok());
  EXPECT_EQ(CheckCollectiveArgs(-1, 1, {&x}).code(), kInvalid);
  EXPECT_EQ(CheckCollectiveArgs(1, 1, {&x, nullptr}).message(),
            "null buffer with count > 0");
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(CheckCollectiveArgs(max / 4, 1, {&x}).ok());
  EXPECT_EQ(CheckCollectiveArgs(max / 4 + 1, 1, {&x}).code(), kInvalid);
  // The multiple (e.g. the group size of an all-gather) tightens the bound.
  EXPECT_TRUE(CheckCollectiveArgs(max / 32, 8, {&x}).ok());
  EXPECT_EQ(CheckCollectiveArgs(max / 32 + 1, 8, {&x}).code(), kInvalid);
}

TEST(CollectiveArgsTest, Root) {
  EXPECT_TRUE(CheckRoot(0, 1).ok());
  EXPECT_TRUE(CheckRoot(3, 4).ok());
  EXPECT_EQ(CheckRoot(-1, 4).code(), kInvalid);
  EXPECT_EQ(CheckRoot(4, 4).message(), "root must be in [0, size); got 4 of 4");
}

}  // namespace
}  // namespace mneme::gpu
