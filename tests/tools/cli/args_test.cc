#include "tools/cli/args.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mneme::cli {
namespace {

TEST(ArgsTest, ParsesValuesBoolsAndPositionals) {
  absl::StatusOr<Args> args =
      Args::Parse({"--out=/tmp/x", "--seed", "7", "--json", "DIR", "--", "--x"},
                  {"out", "seed"}, {"json"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->Get("out", ""), "/tmp/x");
  EXPECT_EQ(*args->GetInt("seed", 0, 0, 100), 7);
  EXPECT_TRUE(args->Has("json"));
  EXPECT_EQ(args->positionals(), (std::vector<std::string>{"DIR", "--x"}));
  EXPECT_EQ(*args->GetInt("missing", 5, 0, 10), 5);
}

TEST(ArgsTest, RejectsUnknownMissingAndRepeatedFlags) {
  EXPECT_EQ(Args::Parse({"--bogus=1"}, {"out"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Args::Parse({"--bogus=1"}, {"out"})
                .status()
                .message()
                .find("unknown flag --bogus"),
            absl::string_view::npos);
  EXPECT_EQ(Args::Parse({"--out"}, {"out"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Args::Parse({"--out=a", "--out=b"}, {"out"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Args::Parse({"--json=maybe"}, {}, {"json"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ArgsTest, ValidatesIntegersListsAndChoices) {
  absl::StatusOr<Args> args =
      Args::Parse({"--n=12", "--ids=1,-2,3", "--bad=1,x", "--fmt=fp8"},
                  {"n", "ids", "bad", "fmt"});
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->GetInt("n", 0, 0, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*args->GetIntList("ids"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(args->GetIntList("bad").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(args->GetIntList("none").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*args->GetChoice("fmt", "nvfp4", {"fp8", "nvfp4"}), "fp8");
  EXPECT_EQ(args->GetChoice("n", "", {"fp8", "nvfp4"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(args->Required("absent").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::cli

namespace mneme::cli {
namespace {

TEST(ArgsDoubleTest, RangeAndSyntax) {
  absl::StatusOr<Args> a = Args::Parse(
      {"--x=0.5", "--y=abc", "--z=nan", "--w=3"}, {"x", "y", "z", "w"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a->GetDouble("x", 0, 0, 1), 0.5);
  EXPECT_EQ(*a->GetDouble("absent", 0.25, 0, 1), 0.25);
  EXPECT_EQ(a->GetDouble("y", 0, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->GetDouble("z", 0, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a->GetDouble("w", 0, 0, 1).status().message()),
              ::testing::HasSubstr("--w=3"));
}

}  // namespace
}  // namespace mneme::cli
