// The community checkpoint variants end to end through `mneme run`: tiny
// models of the released layouts whose experts are EXL3 trellises or a
// GridBook artifact (NVFP4 codebook routed experts with the W4A4 contract,
// FP8 codebook shared experts, FP8 / MXFP4 source passthrough) run on the
// weights as stored, and their prompt logprobs (whole and chunked prefill)
// and greedy tokens equal the same model with every weight dequantized to
// fp32 at load.

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
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

double MaxDifference(const nlohmann::json& a, const nlohmann::json& b) {
  EXPECT_EQ(a.size(), b.size());
  double max_diff = 0.0;
  for (size_t i = 1; i < a.size() && i < b.size(); ++i) {
    max_diff =
        std::max(max_diff, std::fabs(a[i].get<double>() - b[i].get<double>()));
  }
  return max_diff;
}

using Variant = std::tuple<synthetic::ExpertsFormat, synthetic::ReleaseArch>;

class CommunityCheckpointsTest : public ::testing::TestWithParam<Variant> {};

TEST_P(CommunityCheckpointsTest, MatchesTheDequantizedModel) {
  synthetic::ReleaseCheckpointOptions o;
  o.threads = 1;
  o.experts_format = std::get<0>(GetParam());
  o.arch = std::get<1>(GetParam());
  o.out_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/variant-",
                           static_cast<int>(o.experts_format), "-",
                           synthetic::ReleaseArchName(o.arch));
  ASSERT_TRUE(synthetic::MakeReleaseCheckpoint(o).ok());
  const std::vector<std::string> common = {
      "--checkpoint=" + o.out_dir, "--tokens=" + Prompt(), "--max-new-tokens=8",
      "--prompt-logprobs",         "--threads=2",          "--json"};
  std::vector<std::string> dequantized_args = common;
  dequantized_args.emplace_back("--dequantize-weights");
  // Chunks of 7 tokens take the decode-sized products (the weights decoded a
  // tile or a superblock at a time), whole prefill the decoded panels.
  std::vector<std::string> chunked_args = common;
  chunked_args.emplace_back("--chunk-tokens=7");
  absl::StatusOr<nlohmann::json> stored = RunJson(common);
  absl::StatusOr<nlohmann::json> dequantized = RunJson(dequantized_args);
  absl::StatusOr<nlohmann::json> chunked = RunJson(chunked_args);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  ASSERT_TRUE(chunked.ok()) << chunked.status();

  EXPECT_EQ((*stored)["token_ids"], (*dequantized)["token_ids"]);
  EXPECT_EQ((*chunked)["token_ids"], (*stored)["token_ids"]);
  ASSERT_EQ((*stored)["prompt_logprobs"].size(), 40u);
  // The quantized paths sum the same values in another order (fp32).
  EXPECT_LT(MaxDifference((*stored)["prompt_logprobs"],
                          (*dequantized)["prompt_logprobs"]),
            1e-3);
  EXPECT_LT(MaxDifference((*chunked)["prompt_logprobs"],
                          (*dequantized)["prompt_logprobs"]),
            1e-3);
  // The experts stayed in their stored bytes (2 to 5 bits per weight).
  EXPECT_LT((*stored)["weight_bytes"].get<int64_t>() * 3,
            (*dequantized)["weight_bytes"].get<int64_t>());
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CommunityCheckpointsTest,
    ::testing::Combine(::testing::Values(synthetic::ExpertsFormat::kExl3,
                                         synthetic::ExpertsFormat::kGridbook),
                       ::testing::Values(synthetic::ReleaseArch::kV4Flash,
                                         synthetic::ReleaseArch::kV4Flash0731,
                                         synthetic::ReleaseArch::kV41Flash)),
    [](const ::testing::TestParamInfo<Variant>& info) {
      std::string name = absl::StrCat(
          std::get<0>(info.param) == synthetic::ExpertsFormat::kExl3
              ? "exl3_"
              : "gridbook_",
          synthetic::ReleaseArchName(std::get<1>(info.param)));
      for (char& c : name) {
        if (c == '-' || c == '.') c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace mneme::cli
