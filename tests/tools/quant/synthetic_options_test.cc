// The synthetic checkpoint options the conversion tools rely on: MXFP4
// routed experts for main and draft layers, and the correlated wkv.
#include <filesystem>

#include "checkpoint/dtype.h"
#include "checkpoint/sharded_checkpoint.h"
#include "engram_store/engram_checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/tools/quant/checkpoint_test_util.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::synthetic {
namespace {

using checkpoint::DType;
using quant::testing::ReadFile;

SyntheticCheckpointOptions Small(const std::string& name) {
  SyntheticCheckpointOptions o;
  o.out_dir = mneme::testing::MakeTempDir(name) + "/ckpt";
  o.engram_vocab_size = 100;
  o.threads = 2;
  return o;
}

TEST(SyntheticOptionsTest, Mxfp4ExpertsForMainAndDraftLayers) {
  SyntheticCheckpointOptions o = Small("experts");
  o.expert_layer_ids = {0, 3};
  o.draft_stages = 2;
  o.num_routed_experts = 2;
  o.moe_intermediate_size = 96;
  ASSERT_TRUE(MakeSyntheticCheckpoint(o).ok());
  auto c = checkpoint::ShardedCheckpoint::Create(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->shards().size(), 5u);  // 2 Engram + 2 layers + 1 draft
  for (const char* prefix : {"layers.0", "layers.3", "mtp.0", "mtp.1"}) {
    for (int e = 0; e < 2; ++e) {
      for (int w = 1; w <= 3; ++w) {
        const std::string base = std::string(prefix) + ".ffn.experts." +
                                 std::to_string(e) + ".w" + std::to_string(w);
        const checkpoint::TensorLocation* weight =
            (*c)->FindOrNull(base + ".weight");
        const checkpoint::TensorLocation* scale =
            (*c)->FindOrNull(base + ".scale");
        ASSERT_TRUE(weight && scale) << base;
        const int64_t out = w == 2 ? 64 : 96;
        const int64_t in = w == 2 ? 96 : 64;
        EXPECT_EQ(weight->info->dtype, DType::kU8);
        EXPECT_EQ(weight->info->shape, (std::vector<int64_t>{out, in / 2}));
        EXPECT_EQ(scale->info->dtype, DType::kF8E8M0);
        EXPECT_EQ(scale->info->shape, (std::vector<int64_t>{out, in / 32}));
        // Exponents near 2^-7 (w1 120, w3 121, w2 119, +-2).
        const std::vector<uint8_t> s =
            *scale->shard->ReadTensor(base + ".scale");
        for (uint8_t code : s) {
          EXPECT_GE(code, 117);
          EXPECT_LE(code, 123);
        }
      }
    }
  }
  const nlohmann::json config =
      nlohmann::json::parse(ReadFile(o.out_dir + "/config.json"));
  EXPECT_EQ(config["text_config"]["n_routed_experts"], 2);
  EXPECT_EQ(config["text_config"]["moe_intermediate_size"], 96);
  EXPECT_EQ(config["text_config"]["num_nextn_predict_layers"], 2);
  EXPECT_TRUE(engram::EngramCheckpoint::Open(o.out_dir).ok());
}

TEST(SyntheticOptionsTest, CorrelatedWkvIsDeterministicAndCorrelated) {
  SyntheticCheckpointOptions a = Small("wkv-a");
  a.wkv_kind = WkvKind::kCorrelated;
  SyntheticCheckpointOptions b = Small("wkv-b");
  b.wkv_kind = WkvKind::kCorrelated;
  ASSERT_TRUE(MakeSyntheticCheckpoint(a).ok());
  ASSERT_TRUE(MakeSyntheticCheckpoint(b).ok());
  EXPECT_EQ(quant::testing::ReadTree(a.out_dir),
            quant::testing::ReadTree(b.out_dir));
  // Neighbouring inputs of a hash column correlate (~0.5), inputs of
  // different columns do not.
  const std::vector<std::vector<double>> h =
      quant::testing::NaiveWkvHessians(a.out_dir, 1);
  double near = 0, across = 0;
  for (int c = 0; c < 24; ++c) {
    for (int i = 0; i + 1 < 256; ++i) {
      near += h[c][i * 256 + i + 1] /
              std::sqrt(h[c][i * 256 + i] * h[c][(i + 1) * 256 + i + 1]);
    }
  }
  near /= 24 * 255;
  // Correlation between input 255 of column c and 0 of column c + 1 would
  // need the full matrix; within a column, inputs 128 apart are ~0.
  for (int c = 0; c < 24; ++c) {
    for (int i = 0; i < 128; ++i) {
      across += h[c][i * 256 + i + 128] /
                std::sqrt(h[c][i * 256 + i] * h[c][(i + 128) * 256 + i + 128]);
    }
  }
  across /= 24 * 128;
  EXPECT_GT(near, 0.4);
  EXPECT_LT(near, 0.6);
  EXPECT_LT(std::fabs(across), 0.05);
}

TEST(SyntheticOptionsTest, RejectsBadExpertOptions) {
  SyntheticCheckpointOptions o = Small("bad");
  o.expert_layer_ids = {2, 1};
  EXPECT_EQ(MakeSyntheticCheckpoint(o).code(),
            absl::StatusCode::kInvalidArgument);
  o.expert_layer_ids = {7};
  EXPECT_EQ(MakeSyntheticCheckpoint(o).code(),
            absl::StatusCode::kInvalidArgument);
  o.expert_layer_ids = {1};
  o.moe_intermediate_size = 40;
  EXPECT_EQ(MakeSyntheticCheckpoint(o).code(),
            absl::StatusCode::kInvalidArgument);
  o.moe_intermediate_size = 64;
  o.num_routed_experts = 0;
  EXPECT_EQ(MakeSyntheticCheckpoint(o).code(),
            absl::StatusCode::kInvalidArgument);
  o.num_routed_experts = 1;
  o.draft_stages = -1;
  EXPECT_EQ(MakeSyntheticCheckpoint(o).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::synthetic
