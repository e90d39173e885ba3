#include "common/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace mneme {
namespace {

absl::Status Check(int value) {
  if (value < 0) return absl::InvalidArgumentError("negative");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<std::string>> Make(int value) {
  RETURN_IF_ERROR(Check(value));
  return std::make_unique<std::string>(std::to_string(value));
}

absl::Status Twice(int first, int second, std::string* out) {
  RETURN_IF_ERROR(Check(first));
  RETURN_IF_ERROR(Check(second));
  *out = "both";
  return absl::OkStatus();
}

absl::StatusOr<std::string> Concat(int first, int second) {
  ASSIGN_OR_RETURN(std::unique_ptr<std::string> a, Make(first));
  ASSIGN_OR_RETURN(auto b, Make(second));
  std::string joined;
  ASSIGN_OR_RETURN(joined, absl::StatusOr<std::string>(*a + *b));
  return joined;
}

TEST(StatusMacrosTest, ReturnIfErrorPassesOkThrough) {
  std::string out;
  EXPECT_TRUE(Twice(1, 2, &out).ok());
  EXPECT_EQ(out, "both");
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheFirstErrorUnchanged) {
  std::string out;
  absl::Status status = Twice(1, -2, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "negative");
  EXPECT_TRUE(out.empty());
}

TEST(StatusMacrosTest, ReturnIfErrorInStatusOrFunction) {
  absl::StatusOr<std::unique_ptr<std::string>> made = Make(-1);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacrosTest, AssignOrReturnMovesValues) {
  absl::StatusOr<std::string> joined = Concat(4, 2);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(*joined, "42");
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesErrors) {
  EXPECT_EQ(Concat(-4, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Concat(4, -2).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme
