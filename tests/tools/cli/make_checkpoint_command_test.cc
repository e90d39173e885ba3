// `mneme make-checkpoint`: the --model preset, the flags that override it,
// and the flag errors.
#include "tools/cli/make_checkpoint_command.h"

#include <filesystem>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/sharded_checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/tools/synthetic/model_layout_checks.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::cli {
namespace {

using synthetic::SyntheticCheckpointOptions;

struct MakeResult {
  absl::Status status;
  std::string out;
};

MakeResult Make(std::vector<std::string> argv) {
  std::ostringstream out;
  // Small Engram tables keep the tests quick; they do not affect the rest.
  argv.emplace_back("--engram-vocab-size=100");
  argv.emplace_back("--threads=2");
  MakeResult run;
  run.status = RunMakeCheckpoint(argv, out);
  run.out = out.str();
  return run;
}

std::string NewDir(const std::string& name) {
  return mneme::testing::MakeTempDir(name) + "/ckpt";
}

TEST(MakeCheckpointCommandTest, ModelWritesTheTinyModelOfModelLayout) {
  const std::string dir = NewDir("model");
  const MakeResult run = Make({"--model", "--out", dir});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(absl::StartsWith(
      run.out, "wrote " + dir +
                   ": synthetic model (4 layers, hidden 256, 8 heads, 16 "
                   "experts top-2, hc_mult 4), fp8 Engram tables, seed 0,"))
      << run.out;
  SyntheticCheckpointOptions want = synthetic::TinyModelOptions();
  want.engram_vocab_size = 100;
  synthetic::testing::ExpectFullModelCheckpoint(dir, want);
}

TEST(MakeCheckpointCommandTest, ArchWritesTheReleasedLayout) {
  for (const char* arch : {"v4-flash", "v4.1-flash", "v4-flash-0731"}) {
    const std::string dir = NewDir(absl::StrCat("arch-", arch));
    const MakeResult run =
        Make({"--model", "--out", dir, absl::StrCat("--arch=", arch)});
    ASSERT_TRUE(run.status.ok()) << arch << ": " << run.status;
    EXPECT_TRUE(absl::StartsWith(
        run.out, absl::StrCat("wrote ", dir, ": tiny ", arch,
                              " checkpoint of the released layout, seed 0,")))
        << run.out;
    EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  }
  const std::string dir = NewDir("arch-full");
  const MakeResult run =
      Make({"--model", "--out", dir, "--arch=v4-flash", "--full-shapes"});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(absl::StartsWith(
      run.out,
      absl::StrCat("wrote ", dir, ": full-shape (sparse) v4-flash checkpoint")))
      << run.out;
}

TEST(MakeCheckpointCommandTest, FlagsOverrideThePreset) {
  const std::string dir = NewDir("flags");
  const MakeResult run =
      Make({"--model", "--out", dir, "--hidden-size=128", "--layers=6",
            "--engram-layers=2,5", "--heads=4", "--head-dim=32", "--top-k=3",
            "--experts=8", "--hc-mult=1", "--sliding-window=4",
            "--moe-intermediate-size=32", "--engram-format=nvfp4", "--seed=9"});
  ASSERT_TRUE(run.status.ok()) << run.status;
  SyntheticCheckpointOptions want = synthetic::TinyModelOptions();
  want.engram_vocab_size = 100;
  want.engram_format = formats::RowFormat::kNvfp4;
  want.hidden_size = 128;
  want.num_hidden_layers = 6;
  want.engram_layer_ids = {2, 5};
  want.num_attention_heads = 4;
  want.head_dim = 32;
  want.num_experts_per_tok = 3;
  want.num_routed_experts = 8;
  want.hc_mult = 1;
  want.sliding_window = 4;
  want.moe_intermediate_size = 32;
  // --layers without --compress-ratios repeats the preset's pattern.
  want.compress_ratios = {0, 1, 2, 4, 0, 1};
  synthetic::testing::ExpectFullModelCheckpoint(dir, want);
}

TEST(MakeCheckpointCommandTest, CompressRatiosFlag) {
  const std::string dir = NewDir("ratios");
  const MakeResult run =
      Make({"--model", "--out", dir, "--compress-ratios=4,0,0,8"});
  ASSERT_TRUE(run.status.ok()) << run.status;
  SyntheticCheckpointOptions want = synthetic::TinyModelOptions();
  want.engram_vocab_size = 100;
  want.compress_ratios = {4, 0, 0, 8};
  synthetic::testing::ExpectFullModelCheckpoint(dir, want);
}

TEST(MakeCheckpointCommandTest, WithoutModelTheEngramLayersOnly) {
  const std::string dir = NewDir("engram-only");
  const MakeResult run = Make({"--out", dir});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(
      absl::StartsWith(run.out, "wrote " + dir + ": synthetic checkpoint, "))
      << run.out;
  auto c = checkpoint::ShardedCheckpoint::Create(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->shards().size(), 2u);
  EXPECT_EQ((*c)->FindOrNull("embed.weight"), nullptr);
}

struct BadFlags {
  std::string name;
  std::vector<std::string> argv;
  // Expected at the start of the message.
  std::string message;
};

void PrintTo(const BadFlags& b, std::ostream* os) { *os << b.name; }

class MakeCheckpointBadFlagsTest : public ::testing::TestWithParam<BadFlags> {};

TEST_P(MakeCheckpointBadFlagsTest, InvalidArgument) {
  std::vector<std::string> argv = GetParam().argv;
  const std::string dir = NewDir("bad");
  argv.push_back("--out=" + dir);
  const MakeResult run = Make(argv);
  EXPECT_EQ(run.status.code(), absl::StatusCode::kInvalidArgument)
      << run.status;
  EXPECT_TRUE(absl::StartsWith(run.status.message(), GetParam().message))
      << run.status;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

INSTANTIATE_TEST_SUITE_P(
    Flags, MakeCheckpointBadFlagsTest,
    ::testing::Values(
        BadFlags{
            "HeadsWithoutModel", {"--heads=4"}, "--heads requires --model"},
        BadFlags{"RatiosWithoutModel",
                 {"--compress-ratios=0,1,2,4"},
                 "--compress-ratios requires --model"},
        BadFlags{"ExpertLayersWithModel",
                 {"--model", "--expert-layers=0"},
                 "--expert-layers cannot be combined with --model"},
        BadFlags{"DraftStagesWithModel",
                 {"--model", "--draft-stages=1"},
                 "--draft-stages cannot be combined with --model"},
        BadFlags{"RatiosForTooFewLayers",
                 {"--model", "--compress-ratios=0,1"},
                 "compress_ratios"},
        BadFlags{"RatioNotAnInteger",
                 {"--model", "--compress-ratios=0,x,1,2"},
                 "--compress-ratios: 'x' is not an integer"},
        BadFlags{"NegativeRatio",
                 {"--model", "--compress-ratios=0,-1,1,2"},
                 "--compress-ratios: -1 out of range"},
        BadFlags{"TopKAboveExperts",
                 {"--model", "--top-k=17"},
                 "num_experts_per_tok"},
        BadFlags{"ZeroHeads", {"--model", "--heads=0"}, "--heads"},
        BadFlags{"HeadsNotAMultipleOfGroups",
                 {"--model", "--heads=6"},
                 "num_attention_heads"},
        BadFlags{"EngramLayerPastTheLayers",
                 {"--model", "--layers=2"},
                 "engram_layer_ids"},
        BadFlags{"HiddenNotAMultipleOf32",
                 {"--model", "--hidden-size=100"},
                 "hidden_size"},
        BadFlags{
            "ArchWithoutModel", {"--arch=v4-flash"}, "--arch requires --model"},
        BadFlags{"UnknownArch",
                 {"--model", "--arch=v5"},
                 "--arch=v5: must be one of v4-flash, v4.1-flash, "
                 "v4-flash-0731"},
        BadFlags{"FullShapesWithoutArch",
                 {"--model", "--full-shapes"},
                 "--full-shapes requires --arch"},
        BadFlags{"ArchWithDimensions",
                 {"--model", "--arch=v4-flash", "--hidden-size=128"},
                 "--hidden-size cannot be combined with --arch"},
        BadFlags{"ArchWithEngramFormat",
                 {"--model", "--arch=v4.1-flash", "--engram-format=nvfp4"},
                 "--engram-format cannot be combined with --arch"}),
    [](const ::testing::TestParamInfo<BadFlags>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme::cli
