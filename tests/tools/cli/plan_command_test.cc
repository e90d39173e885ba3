// `mneme plan` on sparse full-shape checkpoints of the released layouts:
// the KV bytes per token against the documented figures, the weight split
// against the single-rank plan, the pool arithmetic, and the flag errors.
#include "tools/cli/plan_command.h"

#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::cli {
namespace {

using ::testing::HasSubstr;

std::string MakeFull(synthetic::ReleaseArch arch, const std::string& name) {
  synthetic::ReleaseCheckpointOptions o;
  o.out_dir = testing::MakeTempDir("plan") + "/" + name;
  o.arch = arch;
  o.full_shapes = true;
  const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(st.ok()) << st;
  return o.out_dir;
}

class PlanTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    v41_ = new std::string(MakeFull(synthetic::ReleaseArch::kV41Flash, "v41"));
    v4_ = new std::string(MakeFull(synthetic::ReleaseArch::kV4Flash, "v4"));
  }
  static nlohmann::json Plan(const std::string& dir, int tp, int dcp,
                             const std::string& bytes) {
    std::ostringstream out;
    const absl::Status st =
        RunPlan({"--checkpoint", dir, "--tp", absl::StrCat(tp), "--dcp",
                 absl::StrCat(dcp), "--kv-cache-bytes", bytes, "--json"},
                out);
    EXPECT_TRUE(st.ok()) << st;
    return nlohmann::json::parse(out.str(), nullptr, false);
  }
  static std::string* v41_;
  static std::string* v4_;
};
std::string* PlanTest::v41_ = nullptr;
std::string* PlanTest::v4_ = nullptr;

TEST_F(PlanTest, V41KvBytesPerToken) {
  const nlohmann::json j = Plan(*v41_, 4, 4, "6GiB");
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["model_type"], "deepseek_v41");
  const nlohmann::json& kv = j["kv_per_token"];
  // MODEL_V41.md 1.2: 890 B/token of global KV in the release's storage.
  EXPECT_DOUBLE_EQ(kv["compact_bytes"].get<double>(), 890.0);
  EXPECT_DOUBLE_EQ(kv["compact_entry_bytes"].get<double>(), 288.0);
  EXPECT_DOUBLE_EQ(kv["compact_index_key_bytes"].get<double>(), 68.0);
  // The pool: a 2048-byte row per entry and per index key of the kv
  // sources 2, 8, 14 (ratio 2) and 20 (ratio 1).
  const double pool = 3 * (2 * 2048.0 / 2) + 2 * 2048.0;
  EXPECT_DOUBLE_EQ(kv["pool_bytes"].get<double>(), pool);
  EXPECT_DOUBLE_EQ(kv["pool_bytes_per_rank"].get<double>(), pool / 4);
  const nlohmann::json& types = kv["by_type"];
  EXPECT_EQ(types[0]["layers"], 2);   // window-only 0, 1
  EXPECT_EQ(types[1]["layers"], 4);   // sources
  EXPECT_EQ(types[2]["layers"], 34);  // readers
  // Pool: whole blocks of 16 rows; tokens over all four ranks.
  const int64_t blocks = (int64_t{6} << 30) / (int64_t{16} * 2048);
  EXPECT_EQ(j["kv_pool"]["blocks"], blocks);
  EXPECT_EQ(j["kv_pool"]["tokens"],
            static_cast<int64_t>(std::floor(blocks * 16 * 2048 * 4 / pool)));
  const int64_t longest = j["kv_pool"]["longest_sequence"];
  EXPECT_GT(longest, 0);
  EXPECT_LE(longest, j["kv_pool"]["tokens"].get<int64_t>());
  // Window (40 layers x 128 rows) and state rows fit well under 1 %.
  EXPECT_GT(longest, j["kv_pool"]["tokens"].get<int64_t>() * 99 / 100);
}

TEST_F(PlanTest, V4KvBytesPerToken) {
  const nlohmann::json j = Plan(*v4_, 4, 1, "1GiB");
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["model_type"], "deepseek_v4");
  const nlohmann::json& kv = j["kv_per_token"];
  EXPECT_DOUBLE_EQ(kv["compact_entry_bytes"].get<double>(), 584.0);
  // 43 layers: 0, 1 window-only, then ratio 4 on even and 128 on odd ones.
  double compact = 0, pool = 0;
  for (int l = 2; l < 43; ++l) {
    const int r = l % 2 == 0 ? 4 : 128;
    compact += 584.0 / r + (r == 4 ? 68.0 / r : 0);
    pool += 2048.0 / r * (r == 4 ? 2 : 1);
  }
  EXPECT_NEAR(kv["compact_bytes"].get<double>(), compact, 1e-9);
  EXPECT_NEAR(kv["pool_bytes"].get<double>(), pool, 1e-9);
  EXPECT_EQ(kv["by_type"][3]["layers"], 21);  // index keys: the ratio-4 layers
  EXPECT_EQ(j["weights"]["engram_table_bytes"], 0);
}

TEST_F(PlanTest, WeightsSplitAcrossRanks) {
  const nlohmann::json one = Plan(*v41_, 1, 1, "1GiB");
  const nlohmann::json four = Plan(*v41_, 4, 4, "1GiB");
  const nlohmann::json& w1 = one["weights"];
  const nlohmann::json& w4 = four["weights"];
  // One rank loads everything but the drafts, Engram tables and vision.
  const uint64_t on_disk = w1["on_disk_bytes"];
  EXPECT_EQ(w1["ranks"][0]["loaded_bytes"].get<uint64_t>(),
            on_disk - w1["draft_bytes"].get<uint64_t>() -
                w1["engram_table_bytes"].get<uint64_t>() -
                w1["not_loaded_bytes"].get<uint64_t>());
  EXPECT_GT(w1["engram_table_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(w1["not_loaded_bytes"].get<uint64_t>(), 0u);
  // Four ranks: replicated bytes equal, the split ones add up to the whole
  // (up to the rounding of each part).
  uint64_t split = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(w4["ranks"][r]["replicated_bytes"],
              w4["ranks"][0]["replicated_bytes"]);
    split += w4["ranks"][r]["split_bytes"].get<uint64_t>();
  }
  const uint64_t split1 = w1["ranks"][0]["split_bytes"];
  EXPECT_LE(split, split1);
  EXPECT_GE(split + int64_t{4} * 100000, split1);
  EXPECT_EQ(w4["ranks"][0]["replicated_bytes"].get<uint64_t>(),
            w1["ranks"][0]["replicated_bytes"].get<uint64_t>());
}

TEST_F(PlanTest, TextOutputNamesTheSections) {
  std::ostringstream out;
  ASSERT_TRUE(RunPlan({"--checkpoint", *v41_, "--tp", "4", "--dcp", "4",
                       "--kv-cache-bytes", "6GiB"},
                      out)
                  .ok());
  for (const char* want :
       {"DeepSeek-V4.1-Flash (deepseek_v41)", "weights per rank",
        "Engram tables", "draft stages", "KV bytes per token",
        "compressing source", "index keys", "890.00",
        "fixed bytes per sequence", "longest single sequence"}) {
    EXPECT_THAT(out.str(), HasSubstr(want));
  }
}

struct BadPlan {
  std::vector<std::string> argv;
  std::string error;
};

TEST_F(PlanTest, FlagErrors) {
  const std::vector<BadPlan> bad = {
      {{"--tp", "4", "--kv-cache-bytes", "1GiB"}, "--checkpoint"},
      {{"--checkpoint", *v41_, "--kv-cache-bytes", "1GiB"}, "--tp"},
      {{"--checkpoint", *v41_, "--tp", "4"}, "--kv-cache-bytes"},
      {{"--checkpoint", *v41_, "--tp", "4", "--dcp", "2", "--kv-cache-bytes",
        "1GiB"},
       "must be 1 or the --tp"},
      {{"--checkpoint", *v41_, "--tp", "3", "--kv-cache-bytes", "1GiB"}, "3"},
      {{"--checkpoint", *v41_, "--tp", "0", "--kv-cache-bytes", "1GiB"},
       "--tp"},
      {{"--checkpoint", *v41_, "--tp", "4", "--kv-cache-bytes", "6XB"},
       "unknown unit"},
      {{"--checkpoint", *v41_, "--tp", "4", "--kv-cache-bytes", "0"},
       "positive"},
      {{"--checkpoint", "/nonexistent/ckpt", "--tp", "4", "--kv-cache-bytes",
        "1GiB"},
       "/nonexistent/ckpt"},
      {{"--checkpoint", *v41_, "--tp", "4", "--kv-cache-bytes", "1GiB",
        "extra"},
       "unexpected argument"},
  };
  for (const BadPlan& b : bad) {
    std::ostringstream out;
    const absl::Status st = RunPlan(b.argv, out);
    EXPECT_FALSE(st.ok()) << b.error;
    EXPECT_THAT(std::string(st.message()), HasSubstr(b.error));
  }
}

TEST(ParseByteCountTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseByteCount("b", "6GiB"), int64_t{6} << 30);
  EXPECT_EQ(*ParseByteCount("b", "1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteCount("b", "2GB"), 2000000000);
  EXPECT_EQ(*ParseByteCount("b", "4096"), 4096);
  EXPECT_EQ(*ParseByteCount("b", "10KiB"), 10240);
  for (const char* bad :
       {"", "GiB", "1.2.3GiB", "-5", "5 apples", "2TiBx", "2000TiB"}) {
    EXPECT_FALSE(ParseByteCount("b", bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace mneme::cli
