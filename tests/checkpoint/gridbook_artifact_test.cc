// GridbookArtifact on the tiny GridBook checkpoint of make-checkpoint and on
// edited copies of its quant_config.json: placements of every module kind,
// the Transformers spelling of targets, and each refusal with its code.

#include "checkpoint/gridbook_artifact.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

const std::string& Original() {
  static const std::string* dir = [] {
    auto* d = new std::string(
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/gridbook-tiny"));
    synthetic::ReleaseCheckpointOptions o;
    o.out_dir = *d;
    o.threads = 1;
    o.arch = synthetic::ReleaseArch::kV4Flash;
    o.experts_format = synthetic::ExpertsFormat::kGridbook;
    const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
    EXPECT_TRUE(st.ok()) << st;
    return d;
  }();
  return *dir;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A copy of the checkpoint (shards linked) with quant_config.json edited.
std::string Edited(const std::string& name,
                   const std::function<void(json&)>& edit) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/edited-", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(Original())) {
    const fs::path to = fs::path(dir) / e.path().filename();
    if (e.path().filename() == "quant_config.json") continue;
    fs::create_symlink(fs::absolute(e.path()), to);
  }
  json quant = ReadJson(Original() + "/quant_config.json");
  edit(quant);
  std::ofstream(dir + "/quant_config.json") << quant.dump(2);
  return dir;
}

absl::Status OpenStatus(const std::string& dir) {
  return GridbookArtifact::Open(dir).status();
}

TEST(GridbookArtifactTest, PlacesEveryModuleKind) {
  auto artifact = GridbookArtifact::Open(Original());
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  ASSERT_NE(*artifact, nullptr);
  const GridbookArtifact& a = **artifact;
  EXPECT_EQ(a.groups().size(), 2u);

  auto w1 = a.Find("layers.2.ffn.experts.5.w1");
  ASSERT_TRUE(w1.has_value());
  EXPECT_EQ(w1->tensor, "layers.2.ffn.experts.gate_up_proj");
  EXPECT_EQ(w1->expert, 5);
  EXPECT_EQ(w1->rows, GridbookPlacement::Rows::kFirstHalf);
  EXPECT_EQ(w1->group->format, "NVFP4_CB_K16");
  EXPECT_TRUE(w1->group->w4a4);
  auto w3 = a.Find("layers.2.ffn.experts.5.w3");
  ASSERT_TRUE(w3.has_value());
  EXPECT_EQ(w3->rows, GridbookPlacement::Rows::kSecondHalf);
  auto w2 = a.Find("layers.2.ffn.experts.0.w2");
  ASSERT_TRUE(w2.has_value());
  EXPECT_EQ(w2->tensor, "layers.2.ffn.experts.down_proj");
  EXPECT_EQ(w2->rows, GridbookPlacement::Rows::kAll);

  // Targets in the Transformers spelling (model.layers.N.mlp.shared_experts
  // .gate_proj) place the checkpoint's module.
  auto shared = a.Find("layers.1.ffn.shared_experts.w1");
  ASSERT_TRUE(shared.has_value());
  EXPECT_EQ(shared->tensor, "layers.1.ffn.shared_experts.w1");
  EXPECT_EQ(shared->group->format, "FP8_CB_K36");
  EXPECT_FALSE(shared->group->w4a4);
  EXPECT_EQ(shared->expert, -1);

  // Passthrough and unlisted modules are not codebook targets.
  EXPECT_FALSE(a.Find("layers.0.attn.wq_a").has_value());
  EXPECT_TRUE(a.passthrough().contains("layers.0.attn.wq_a"));
  EXPECT_FALSE(a.Find("mtp.0.ffn.experts.1.w1").has_value());
  EXPECT_FALSE(a.Find("layers.0.ffn.gate").has_value());
}

TEST(GridbookArtifactTest, OtherCheckpointsHaveNoArtifact) {
  const std::string dir = Edited("not-gridbook", [](json&) {});
  json config = ReadJson(dir + "/config.json");
  config["quantization_config"] = {{"quant_method", "fp8"}};
  fs::remove(dir + "/config.json");
  std::ofstream(dir + "/config.json") << config.dump();
  auto artifact = GridbookArtifact::Open(dir);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(*artifact, nullptr);
}

struct Refusal {
  const char* name;
  std::function<void(json&)> edit;
  absl::StatusCode code;
  const char* message;
};

TEST(GridbookArtifactTest, RefusesWhatItCannotServe) {
  const Refusal refusals[] = {
      {"digest",
       [](json& q) {
         q["provenance"]["codebook_sha256"]
          ["cb_codebook.experts.NVFP4_CB_K16.sub0"] = std::string(64, '0');
       },
       absl::StatusCode::kDataLoss, "does not match"},
      {"digest-cover",
       [](json& q) {
         q["provenance"]["codebook_sha256"].erase(
             "cb_codebook.shared.FP8_CB_K36.sub3");
       },
       absl::StatusCode::kDataLoss, "but the sidecar holds"},
      {"digest-empty",
       [](json& q) { q["provenance"]["codebook_sha256"] = json::object(); },
       absl::StatusCode::kInvalidArgument, "codebook_sha256"},
      {"scale-kind",
       [](json& q) {
         q["config_groups"]["group_routed_experts"]["scheme"]["scale_coding"]
          ["kind"] = "three_tier";
       },
       absl::StatusCode::kInvalidArgument, "unknown scale_coding kind"},
      {"type-size",
       [](json& q) {
         q["config_groups"]["group_shared_experts"]["scheme"]["type_size"] =
             145;
       },
       absl::StatusCode::kInvalidArgument, "type_size"},
      {"per-expert",
       [](json& q) {
         q["per_expert_format_groups"] = {{"x", 1}};
       },
       absl::StatusCode::kInvalidArgument, "per_expert_format_groups"},
      {"passthrough-target",
       [](json& q) {
         q["source_passthrough"]["units"]["layers.1.ffn.shared_experts.w3"] =
             "fp8_e4m3_ue8m0_block128";
       },
       absl::StatusCode::kInvalidArgument, "also a codebook target"},
      {"passthrough-wire",
       [](json& q) {
         q["source_passthrough"]["units"]["model.layers.0.self_attn.wq_a"] =
             "mxfp8_e4m3_e8m0_g32";
       },
       absl::StatusCode::kInvalidArgument, "not served"},
      {"contract-digest",
       [](json& q) {
         q["execution_contracts"]["nvfp4_w4a4"]["target_values_sha256"] =
             std::string(64, 'a');
       },
       absl::StatusCode::kDataLoss, "target_values_sha256"},
      {"contract-missing",
       [](json& q) {
         q["config_groups"]["group_routed_experts"]["scheme"].erase(
             "activation_contract");
       },
       absl::StatusCode::kInvalidArgument, "does not carry the contract"},
      {"codebook-ref",
       [](json& q) {
         q["config_groups"]["group_shared_experts"]["scheme"]["codebook_ref"]
          [2] = "cb_codebook.nowhere";
       },
       absl::StatusCode::kInvalidArgument, "is not a table of the sidecar"},
      {"target-twice",
       [](json& q) {
         q["config_groups"]["group_shared_experts"]["targets"].push_back(
             "layers.0.ffn.experts.down_proj");
       },
       absl::StatusCode::kInvalidArgument, "claimed by two groups"},
      {"stock-group",
       [](json& q) {
         q["config_groups"]["group_int4"] = {{"format", "pack-quantized"},
                                             {"targets", {"Linear"}}};
       },
       absl::StatusCode::kInvalidArgument, "without a codebook scheme"},
      {"per-role-fp4",
       [](json& q) {
         json& g = q["config_groups"]["group_routed_experts"];
         g["targets"][0] = "layers.0.ffn.experts.gate_proj";
         g["targets"].push_back("layers.0.ffn.experts.up_proj");
       },
       absl::StatusCode::kInvalidArgument, "per-role"},
  };
  for (const Refusal& r : refusals) {
    const absl::Status status = OpenStatus(Edited(r.name, r.edit));
    EXPECT_EQ(status.code(), r.code) << r.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(r.message)) << r.name;
  }
}

TEST(GridbookArtifactTest, SpellingMapsTransformersNames) {
  EXPECT_EQ(CheckpointSpelling("model.layers.3.self_attn.wq_a"),
            "layers.3.attn.wq_a");
  EXPECT_EQ(CheckpointSpelling("model.layers.3.mlp.shared_experts.down_proj"),
            "layers.3.ffn.shared_experts.w2");
  EXPECT_EQ(CheckpointSpelling("model.language_model.layers.0.mlp.experts"),
            "layers.0.ffn.experts");
  EXPECT_EQ(CheckpointSpelling("layers.3.ffn.experts.gate_proj"),
            "layers.3.ffn.experts.gate_proj");
}

}  // namespace
}  // namespace mneme::checkpoint
