// `mneme inspect` names the released architecture and what it found: layer
// types, draft stages, Engram layers, image tensors and expert format.
#include "tools/cli/inspect_command.h"

#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Inspects a new checkpoint of `arch`; `status` receives inspect's status.
std::string Inspect(synthetic::ReleaseArch arch, const std::string& name,
                    bool full_shapes, absl::Status* status = nullptr) {
  synthetic::ReleaseCheckpointOptions o;
  o.out_dir = testing::MakeTempDir("inspect") + "/" + name;
  o.arch = arch;
  o.full_shapes = full_shapes;
  o.engram_vocab_size = 100;
  o.threads = 2;
  const absl::Status made = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(made.ok()) << made;
  std::ostringstream out;
  const absl::Status st = RunInspect({o.out_dir}, out);
  if (status != nullptr) {
    *status = st;
  } else {
    EXPECT_TRUE(st.ok()) << st;
  }
  return out.str();
}

// The linear modules per storage format of the community variants (the tiny
// V4-Flash: 5 layers of 16 experts x 3 projections).
TEST(InspectTest, ModuleFormatsOfTheCommunityVariants) {
  for (const auto format :
       {synthetic::ExpertsFormat::kExl3, synthetic::ExpertsFormat::kGridbook}) {
    synthetic::ReleaseCheckpointOptions o;
    o.out_dir = testing::MakeTempDir("inspect") + "/variant";
    o.arch = synthetic::ReleaseArch::kV4Flash;
    o.experts_format = format;
    o.threads = 2;
    ASSERT_TRUE(synthetic::MakeReleaseCheckpoint(o).ok());
    std::ostringstream out;
    ASSERT_TRUE(RunInspect({o.out_dir}, out).ok());
    EXPECT_THAT(out.str(), HasSubstr("module formats"));
    if (format == synthetic::ExpertsFormat::kExl3) {
      for (const char* entry :
           {"EXL3 K2 mcg", "EXL3 K3 mul1", "EXL3 K5 3inst", "FP8 block"}) {
        EXPECT_THAT(out.str(), HasSubstr(entry));
      }
    } else {
      EXPECT_THAT(out.str(),
                  HasSubstr("GridBook NVFP4_CB_K16 (W4A4)            240 "
                            "modules"));
      EXPECT_THAT(out.str(),
                  HasSubstr("GridBook FP8_CB_K36                      15 "
                            "modules"));
      EXPECT_THAT(out.str(), HasSubstr("FP8 block (source passthrough)"));
      EXPECT_THAT(out.str(), HasSubstr("MXFP4 (source passthrough)"));
    }
  }
}

TEST(InspectTest, TinyV41) {
  const std::string out =
      Inspect(synthetic::ReleaseArch::kV41Flash, "v41", false);
  for (const char* want :
       {"DeepSeek-V4.1-Flash (deepseek_v41)\n",
        "main layers                  9\n",
        "window-only                  [0, 1]\n",
        "compressed ratio 1           [6, 7, 8]\n",
        "compressed ratio 2           [2, 3, 4, 5]\n",
        "kv source                    [2, 4, 6]\n",
        "reads a kv source            [3, 5, 7, 8]\n",
        "index source                 [2, 4, 6, 8]\n",
        "candidate source             6 (8 blocks of 4)\n",
        "hash-routed                  none\n",
        "3 (DSpark, block 5, target layers [6, 7, 8])",
        "Engram layers                [1, 3]\n", "MXFP4",
        "layers.1.engram.embed.weight", "compressed vocabulary"}) {
    EXPECT_THAT(out, HasSubstr(want));
  }
  EXPECT_THAT(out, Not(HasSubstr("image tensors                0\n")));
  EXPECT_THAT(out, Not(HasSubstr("with DSpark stages")));
}

TEST(InspectTest, FullShapeV41) {
  // The Engram section may fail on the synthetic tokenizer; the
  // architecture is printed before it either way.
  absl::Status status;
  const std::string out =
      Inspect(synthetic::ReleaseArch::kV41Flash, "v41-full", true, &status);
  for (const char* want :
       {"main layers                  40\n",
        "kv source                    [2, 8, 14, 20]\n",
        "index source                 [2, 8, 14, 20, 24, 28, 32, 36]\n",
        "candidate source             20 (2048 blocks of 8)\n",
        "Engram layers                [1, 14]\n"}) {
    EXPECT_THAT(out, HasSubstr(want));
  }
}

TEST(InspectTest, V4AndV40731) {
  const std::string v4 = Inspect(synthetic::ReleaseArch::kV4Flash, "v4", true);
  for (const char* want :
       {"DeepSeek-V4-Flash (deepseek_v4)\n", "main layers                  43",
        "compressed ratio 4", "compressed ratio 128",
        "hash-routed                  [0, 1, 2]", "1 (MTP)",
        "Engram layers                none", "image tensors                0",
        "MXFP4", "engram\n  none"}) {
    EXPECT_THAT(v4, HasSubstr(want));
  }
  const std::string v0731 =
      Inspect(synthetic::ReleaseArch::kV4Flash0731, "v4-0731", true);
  EXPECT_THAT(v0731,
              HasSubstr("DeepSeek-V4-Flash (deepseek_v4) with DSpark stages"));
  EXPECT_THAT(v0731, HasSubstr("3 (DSpark"));
}

}  // namespace
}  // namespace mneme::cli
