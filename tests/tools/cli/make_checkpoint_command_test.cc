// `mneme make-checkpoint`: the released layouts (--model, --arch,
// --full-shapes), the Engram-only checkpoint, and the flag errors.
#include "tools/cli/make_checkpoint_command.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/sharded_checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace mneme::cli {
namespace {

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

TEST(MakeCheckpointCommandTest, ModelWritesTheTinyV41FlashModel) {
  const std::string dir = NewDir("model");
  const MakeResult run = Make({"--model", "--out", dir});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(absl::StartsWith(
      run.out, "wrote " + dir +
                   ": tiny v4.1-flash checkpoint of the released layout, "
                   "seed 0,"))
      << run.out;
  std::ifstream in(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["model_type"], "deepseek_v41");
  EXPECT_FALSE(config["text_config"].contains("engram_quant"));
}

TEST(MakeCheckpointCommandTest, NvFp4EngramTables) {
  const std::string dir = NewDir("nvfp4");
  const MakeResult run =
      Make({"--model", "--out", dir, "--engram-format=nvfp4", "--seed=9"});
  ASSERT_TRUE(run.status.ok()) << run.status;
  std::ifstream in(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["text_config"]["engram_quant"], "nvfp4");
  EXPECT_EQ(config["text_config"]["engram_quant_global_scale"].size(), 2u);
  auto c = checkpoint::ShardedCheckpoint::Create(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  const checkpoint::TensorLocation* table =
      (*c)->FindOrNull("layers.1.engram.embed.weight");
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->info->dtype, checkpoint::DType::kU8);
  EXPECT_EQ(table->info->shape[1], 128);
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
        BadFlags{"ExpertLayersWithModel",
                 {"--model", "--expert-layers=0"},
                 "--expert-layers cannot be combined with --model"},
        BadFlags{"DraftStagesWithModel",
                 {"--model", "--draft-stages=1"},
                 "--draft-stages cannot be combined with --model"},
        BadFlags{
            "HiddenNotAMultipleOf32", {"--hidden-size=100"}, "hidden_size"},
        BadFlags{
            "ArchWithoutModel", {"--arch=v4-flash"}, "--arch requires --model"},
        BadFlags{"UnknownArch",
                 {"--model", "--arch=v5"},
                 "--arch=v5: must be one of v4-flash, v4.1-flash, "
                 "v4-flash-0731"},
        BadFlags{"FullShapesWithoutModel",
                 {"--full-shapes"},
                 "--full-shapes requires --model"},
        BadFlags{"ModelWithDimensions",
                 {"--model", "--arch=v4-flash", "--hidden-size=128"},
                 "--hidden-size cannot be combined with --model"},
        BadFlags{"NvFp4TablesOfV4",
                 {"--model", "--arch=v4-flash", "--engram-format=nvfp4"},
                 "NVFP4 Engram tables are written for the tiny v4.1-flash"}),
    [](const ::testing::TestParamInfo<BadFlags>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme::cli
