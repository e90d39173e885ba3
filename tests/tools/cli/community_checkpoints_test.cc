// The community checkpoint variants end to end through `mneme run`: tiny
// models of the released layouts whose experts are EXL3 trellises run on the
// weights as stored, and their prompt logprobs and greedy tokens equal the
// same model with every weight dequantized to fp32 at load.

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/cli/run_command.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::cli {
namespace {

absl::StatusOr<nlohmann::json> RunJson(const std::vector<std::string>& argv) {
  std::ostringstream out;
  if (absl::Status st = RunRun(argv, out); !st.ok()) return st;
  return nlohmann::json::parse(out.str());
}

// 40 tokens below the tiny vocabulary, with repeats.
std::string Prompt() {
  std::string prompt;
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&prompt, i == 0 ? "" : ",", (i * 37 + 11) % 500);
  }
  return prompt;
}

class CommunityCheckpointsTest
    : public ::testing::TestWithParam<synthetic::ReleaseArch> {};

TEST_P(CommunityCheckpointsTest, Exl3ExpertsMatchTheDequantizedModel) {
  synthetic::ReleaseCheckpointOptions o;
  o.threads = 1;
  o.arch = GetParam();
  o.experts_format = synthetic::ExpertsFormat::kExl3;
  o.out_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/exl3-",
                           synthetic::ReleaseArchName(o.arch));
  ASSERT_TRUE(synthetic::MakeReleaseCheckpoint(o).ok());
  const std::vector<std::string> common = {
      "--checkpoint=" + o.out_dir, "--tokens=" + Prompt(), "--max-new-tokens=8",
      "--prompt-logprobs",         "--threads=2",          "--json"};
  std::vector<std::string> dequantized_args = common;
  dequantized_args.push_back("--dequantize-weights");
  std::vector<std::string> chunked_args = common;
  chunked_args.push_back("--chunk-tokens=7");
  absl::StatusOr<nlohmann::json> stored = RunJson(common);
  absl::StatusOr<nlohmann::json> dequantized = RunJson(dequantized_args);
  absl::StatusOr<nlohmann::json> chunked = RunJson(chunked_args);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  ASSERT_TRUE(chunked.ok()) << chunked.status();

  EXPECT_EQ((*stored)["token_ids"], (*dequantized)["token_ids"]);
  EXPECT_EQ((*chunked)["token_ids"], (*stored)["token_ids"]);
  const auto& a = (*stored)["prompt_logprobs"];
  const auto& b = (*dequantized)["prompt_logprobs"];
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), 40u);
  double max_diff = 0.0;
  for (size_t i = 1; i < a.size(); ++i) {
    max_diff =
        std::max(max_diff, std::fabs(a[i].get<double>() - b[i].get<double>()));
  }
  // The quantized path sums the same values in another order (fp32).
  EXPECT_LT(max_diff, 1e-3);
  // The experts stayed in their trellis bytes (~3.5 bits per weight).
  EXPECT_LT((*stored)["weight_bytes"].get<int64_t>() * 3,
            (*dequantized)["weight_bytes"].get<int64_t>());
}

INSTANTIATE_TEST_SUITE_P(
    Archs, CommunityCheckpointsTest,
    ::testing::Values(synthetic::ReleaseArch::kV4Flash,
                      synthetic::ReleaseArch::kV4Flash0731,
                      synthetic::ReleaseArch::kV41Flash),
    [](const ::testing::TestParamInfo<synthetic::ReleaseArch>& info) {
      std::string name = synthetic::ReleaseArchName(info.param);
      for (char& c : name) {
        if (c == '-' || c == '.') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace mneme::cli
