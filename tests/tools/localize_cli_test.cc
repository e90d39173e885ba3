// Runs `mneme localize` as users do: the copy it makes, its summary, and
// one-line errors for bad input.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/column_split.h"
#include "engram_store/local_copy/local_copy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using Result = ::mneme::testing::CommandResult;

Result Mneme(const std::vector<std::string>& args) {
  return ::mneme::testing::RunMneme(args);
}

std::vector<std::string> Lines(const std::string& text) {
  return ::mneme::testing::NonEmptyLines(text);
}

// The numbers of a line, in order ("layer 1: fp8, 3600 rows" -> 1, 3600).
std::vector<int64_t> Numbers(const std::string& line) {
  std::vector<int64_t> numbers;
  for (absl::string_view word :
       absl::StrSplit(line, absl::ByAnyChar(" ,:()"), absl::SkipEmpty())) {
    int64_t n = 0;
    if (absl::SimpleAtoi(word, &n)) numbers.push_back(n);
  }
  return numbers;
}

class LocalizeCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    checkpoint_ = new std::string(testing::MakeTempDir("cli") + "/ckpt");
    synthetic::SyntheticCheckpointOptions options;
    options.out_dir = *checkpoint_;
    options.engram_vocab_size = 300;
    options.threads = 2;
    ASSERT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
  }
  static std::string* checkpoint_;
};
std::string* LocalizeCliTest::checkpoint_ = nullptr;

TEST_F(LocalizeCliTest, CopiesTheRanksRowsAndPrintsASummary) {
  const std::string out = testing::MakeTempDir("cli") + "/local";
  const Result r = Mneme({"localize", "--checkpoint", *checkpoint_, "--out",
                          out, "--tp", "4", "--rank", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // no progress lines for a small copy
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0],
            absl::StrCat("localized tp 4, rank 2, strided split from ",
                         *checkpoint_, " into ", out));
  EXPECT_EQ(lines[4], absl::StrCat("manifest: ", out, "/manifest.json"));

  auto checkpoint = engram::EngramCheckpoint::Open(*checkpoint_);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const engram::LocalCopyTarget target{
      .tp_size = 4, .ranks = {2}, .split = engram::ColumnSplit::kStrided};
  auto copy = engram::LocalCopy::Open(out, **checkpoint, target,
                                      {.verify_checksums = true});
  ASSERT_TRUE(copy.ok()) << copy.status();
  int64_t total_rows = 0;
  int64_t total_bytes = 0;
  int64_t total_ranges = 0;
  for (size_t i = 0; i < 2; ++i) {
    const checkpoint::EngramTableLocation& table = (*checkpoint)->tables()[i];
    const engram::LocalCopyLayer* layer = (*copy)->Layer(table.layer);
    ASSERT_NE(layer, nullptr);
    EXPECT_THAT(lines[1 + i],
                StartsWith(absl::StrCat("layer ", table.layer, ": fp8, ")));
    EXPECT_EQ(
        Numbers(lines[1 + i]),
        (std::vector<int64_t>{table.layer, layer->covered_rows(),
                              static_cast<int64_t>(layer->data_bytes()),
                              static_cast<int64_t>(layer->ranges.size())}));
    // The rank's rows, byte-identical to the checkpoint's.
    std::vector<int64_t> ids;
    for (int64_t row = 0; row < table.rows; ++row) {
      if ((*copy)->Locate(table.layer, row).has_value()) ids.push_back(row);
    }
    EXPECT_EQ(static_cast<int64_t>(ids.size()), layer->covered_rows());
    std::vector<uint8_t> a(ids.size() * 264), b(ids.size() * 264);
    ASSERT_TRUE((*copy)->ReadRawRows(table.layer, ids, absl::MakeSpan(a)).ok());
    ASSERT_TRUE(
        (*checkpoint)->ReadRawRows(table.layer, ids, absl::MakeSpan(b)).ok());
    EXPECT_TRUE(a == b);
    total_rows += layer->covered_rows();
    total_bytes += static_cast<int64_t>(layer->data_bytes());
    total_ranges += static_cast<int64_t>(layer->ranges.size());
  }
  EXPECT_THAT(lines[3], StartsWith("total: "));
  const std::vector<int64_t> totals = Numbers(lines[3]);
  ASSERT_GE(totals.size(), 5u) << lines[3];
  EXPECT_EQ(totals[0], total_rows);
  EXPECT_EQ(totals[1], total_bytes);
  EXPECT_EQ(totals[2], total_ranges);
  EXPECT_EQ(totals[3], total_ranges);  // copied
  EXPECT_EQ(totals[4], 0);             // already present
  EXPECT_THAT(lines[3], HasSubstr(" MB/s"));

  // Again: nothing to copy.
  const Result again = Mneme({"localize", "--checkpoint", *checkpoint_, "--out",
                              out, "--tp=4", "--rank=2"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr(absl::StrCat("(0 copied, ", total_ranges,
                                                " already present)")));
}

TEST_F(LocalizeCliTest, RefusesAnotherRanksCopyUnlessForced) {
  const std::string out = testing::MakeTempDir("cli") + "/local";
  ASSERT_EQ(Mneme({"localize", "--checkpoint", *checkpoint_, "--out", out,
                   "--tp", "2", "--rank", "0", "--split", "contiguous"})
                .code,
            0);
  const std::vector<std::string> rank1 = {
      "localize", "--checkpoint", *checkpoint_, "--out",   out,         "--tp",
      "2",        "--rank",       "1",          "--split", "contiguous"};
  const Result refused = Mneme(rank1);
  EXPECT_EQ(refused.code, 1);
  ASSERT_EQ(Lines(refused.err).size(), 1u) << refused.err;
  EXPECT_THAT(refused.err, StartsWith("mneme localize: error: "));
  EXPECT_THAT(refused.err, HasSubstr("tp 2, rank 0, contiguous split"));
  EXPECT_THAT(refused.err, HasSubstr("--force"));

  std::vector<std::string> forced = rank1;
  forced.emplace_back("--force");
  const Result r = Mneme(forced);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tp 2, rank 1, contiguous split"));
}

TEST_F(LocalizeCliTest, CopiesSeveralRanksIntoOneDirectory) {
  const std::string out = testing::MakeTempDir("cli") + "/local";
  const Result r = Mneme({"localize", "--checkpoint", *checkpoint_, "--out",
                          out, "--tp", "4", "--rank", "3,1", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("localized tp 4, ranks 1,3, strided split"));
}

TEST_F(LocalizeCliTest, BadInputGivesOneLineErrors) {
  const std::string out = testing::MakeTempDir("cli") + "/local";
  const std::vector<std::string> base = {"--checkpoint", *checkpoint_, "--out",
                                         out};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"localize"};
    args.insert(args.end(), base.begin(), base.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"localize"}, "--checkpoint is required"},
      {{"localize", "--checkpoint", *checkpoint_, "--tp", "1", "--rank", "0"},
       "--out is required"},
      {with({"--rank", "0"}), "--tp is required"},
      {with({"--tp", "2"}), "--rank is required"},
      {with({"--tp", "0", "--rank", "0"}), "--tp=0: expected an integer"},
      {with({"--tp", "two", "--rank", "0"}), "--tp=two"},
      {with({"--tp", "4", "--rank", "4"}), "--rank 4 is outside [0, 4)"},
      {with({"--tp", "4", "--rank", "-1"}), "--rank -1 is outside"},
      {with({"--tp", "4", "--rank", "1,1"}), "--rank 1 is given twice"},
      {with({"--tp", "4", "--rank", "x"}), "'x' is not an integer"},
      {with({"--tp", "4", "--rank", "0", "--split", "diagonal"}),
       "--split=diagonal: expected one of strided|contiguous"},
      {with({"--tp", "3", "--rank", "0"}), "does not divide"},
      {with({"--tp", "5", "--rank", "0", "--split", "contiguous"}),
       "does not divide"},
      {with({"--tp", "2", "--rank", "0", "--threads", "0"}), "--threads=0"},
      {with({"--tp", "2", "--rank", "0", "--bogus"}), "unknown flag --bogus"},
      {with({"--tp", "2", "--rank", "0", "extra"}),
       "takes no positional arguments"},
      {with({"--tp", "2", "--rank", "0", "--force=maybe"}), "--force"},
      {{"localize", "--checkpoint", *checkpoint_, "--out", *checkpoint_, "--tp",
        "2", "--rank", "0"},
       "is the checkpoint directory"},
      {{"localize", "--checkpoint", out + "/missing", "--out", out, "--tp", "2",
        "--rank", "0"},
       out + "/missing"},
  };
  for (const Case& c : cases) {
    const Result r = Mneme(c.args);
    EXPECT_EQ(r.code, 1) << c.message;
    EXPECT_EQ(r.out, "") << c.message;
    EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
    EXPECT_THAT(r.err, StartsWith("mneme localize: error: ")) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
  // Nothing was written into the checkpoint.
  auto checkpoint = engram::EngramCheckpoint::Open(*checkpoint_);
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_FALSE(
      mneme::PathExists(*checkpoint_ + "/manifest.json").value_or(true));
}

TEST_F(LocalizeCliTest, HelpListsTheCommand) {
  const Result r = Mneme({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("localize --checkpoint DIR --out DIR --tp N"));
}

}  // namespace
}  // namespace mneme
