// The full model the synthetic maker writes (Contents::kFullModel): the
// tensors and config keys of docs/MODEL_LAYOUT.md, determinism, option
// validation and the scale of the values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/sharded_checkpoint.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/tools/quant/checkpoint_test_util.h"
#include "tests/tools/synthetic/model_layout_checks.h"
#include "tools/synthetic/synthetic_checkpoint.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic {
namespace {

using formats::RowFormat;
using quant::testing::ReadFile;
using quant::testing::ReadTree;
using quant::testing::TensorBytes;

// The tiny model with small Engram tables, under a fresh directory.
SyntheticCheckpointOptions Tiny(const std::string& name) {
  SyntheticCheckpointOptions o = TinyModelOptions();
  o.out_dir = mneme::testing::MakeTempDir(name) + "/ckpt";
  o.engram_vocab_size = 100;
  o.threads = 2;
  return o;
}

// Decoded FP8 linear weight `prefix` [out, in] (32 x 32 block scales).
std::vector<float> DecodeFp8(const std::string& dir, const std::string& prefix,
                             int64_t out, int64_t in) {
  const std::vector<uint8_t> codes = TensorBytes(dir, prefix + ".weight");
  const std::vector<uint8_t> scales = TensorBytes(dir, prefix + ".scale");
  const int64_t col_blocks = (in + 31) / 32;
  EXPECT_EQ(static_cast<int64_t>(codes.size()), out * in);
  EXPECT_EQ(static_cast<int64_t>(scales.size()), (out + 31) / 32 * col_blocks);
  std::vector<float> values(codes.size());
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      values[r * in + c] =
          formats::E4m3ToFloat(codes[r * in + c]) *
          formats::Ue8m0ToFloat(scales[r / 32 * col_blocks + c / 32]);
    }
  }
  return values;
}

// Decoded MXFP4 expert weight `prefix` [out, in].
std::vector<float> DecodeMxfp4(const std::string& dir,
                               const std::string& prefix, int64_t out,
                               int64_t in) {
  const std::vector<uint8_t> packed = TensorBytes(dir, prefix + ".weight");
  const std::vector<uint8_t> scales = TensorBytes(dir, prefix + ".scale");
  std::vector<float> values(out * in);
  for (int64_t i = 0; i < out * in; ++i) {
    const uint8_t byte = packed[i / 2];
    values[i] = formats::E2m1ToFloat(i % 2 == 0 ? byte & 0xF : byte >> 4) *
                formats::Ue8m0ToFloat(scales[i / 32]);
  }
  return values;
}

std::vector<float> DecodeF32(const std::string& dir, const std::string& name) {
  const std::vector<uint8_t> bytes = TensorBytes(dir, name);
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

std::vector<float> DecodeBf16(const std::string& dir, const std::string& name) {
  const std::vector<uint8_t> bytes = TensorBytes(dir, name);
  std::vector<float> values(bytes.size() / 2);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = formats::Bf16ToFloat(
        static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
  }
  return values;
}

double Rms(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum / v.size());
}

double Mean(const std::vector<float>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

struct LayoutCase {
  std::string name;
  int hc_mult;
  RowFormat format;
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.name; }

class FullModelLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(FullModelLayoutTest, HasEveryTensorAndConfigKeyOfModelLayout) {
  SyntheticCheckpointOptions o = Tiny(GetParam().name);
  o.hc_mult = GetParam().hc_mult;
  o.engram_format = GetParam().format;
  ASSERT_TRUE(MakeSyntheticCheckpoint(o).ok());
  testing::ExpectFullModelCheckpoint(o.out_dir, o);
  // The Engram store opens it as it opens an Engram-only checkpoint.
  absl::StatusOr<std::unique_ptr<engram::EngramCheckpoint>> engram =
      engram::EngramCheckpoint::Open(o.out_dir);
  ASSERT_TRUE(engram.ok()) << engram.status();
  EXPECT_EQ((*engram)->config().format, o.engram_format);
  EXPECT_EQ((*engram)->config().layer_ids, o.engram_layer_ids);
}

INSTANTIATE_TEST_SUITE_P(
    HcMults, FullModelLayoutTest,
    ::testing::Values(LayoutCase{"Hc4Fp8", 4, RowFormat::kFp8},
                      LayoutCase{"Hc1Fp8", 1, RowFormat::kFp8},
                      LayoutCase{"Hc4Nvfp4", 4, RowFormat::kNvfp4}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) {
      return info.param.name;
    });

TEST(FullModelTest, TinyModelOptionsAreThoseOfModelLayout) {
  const SyntheticCheckpointOptions o = TinyModelOptions();
  EXPECT_EQ(o.contents, Contents::kFullModel);
  EXPECT_EQ(o.hidden_size, 256);
  EXPECT_EQ(o.num_hidden_layers, 4);
  EXPECT_EQ(o.engram_layer_ids, (std::vector<int>{1, 3}));
  EXPECT_EQ(o.hc_mult, 4);
  EXPECT_EQ(o.num_routed_experts, 16);
  EXPECT_EQ(o.num_experts_per_tok, 2);
  EXPECT_EQ(o.moe_intermediate_size, 64);
  EXPECT_EQ(o.num_attention_heads, 8);
  EXPECT_EQ(o.head_dim, 64);
  EXPECT_EQ(o.qk_rope_head_dim, 16);
  EXPECT_EQ(o.q_lora_rank, 64);
  EXPECT_EQ(o.o_lora_rank, 64);
  EXPECT_EQ(o.o_groups, 4);
  EXPECT_EQ(o.sliding_window, 16);
  EXPECT_EQ(o.compress_ratios, (std::vector<int>{0, 1, 2, 4}));
  EXPECT_EQ(o.n_shared_experts, 1);
  EXPECT_EQ(o.routed_scaling_factor, 1.5);
  EXPECT_EQ(o.swiglu_limit, 10.0);
  EXPECT_EQ(o.rope_theta, 10000.0);
  EXPECT_EQ(o.hc_sinkhorn_iters, 20);
  EXPECT_EQ(o.engram_vocab_size,
            SyntheticCheckpointOptions{}.engram_vocab_size);
}

TEST(FullModelTest, RatioZeroLayersHaveNoCompressor) {
  SyntheticCheckpointOptions o = Tiny("ratios");
  o.compress_ratios = {0, 4, 0, 2};
  o.n_shared_experts = 0;
  ASSERT_TRUE(MakeSyntheticCheckpoint(o).ok());
  testing::ExpectFullModelCheckpoint(o.out_dir, o);
  auto c = checkpoint::ShardedCheckpoint::Create(o.out_dir);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const auto& [name, location] : (*c)->tensors()) {
    EXPECT_FALSE(absl::StartsWith(name, "layers.0.attn.compressor")) << name;
    EXPECT_FALSE(absl::StartsWith(name, "layers.2.attn.compressor")) << name;
    EXPECT_FALSE(absl::StrContains(name, "shared_experts")) << name;
  }
  const checkpoint::TensorLocation* ape =
      (*c)->FindOrNull("layers.1.attn.compressor.ape");
  ASSERT_NE(ape, nullptr);
  EXPECT_EQ(ape->info->shape, (std::vector<int64_t>{4, 64}));
}

TEST(FullModelTest, OtherDimensionsAndPartialFp8Blocks) {
  SyntheticCheckpointOptions o = Tiny("dims");
  o.hidden_size = 64;
  o.num_hidden_layers = 3;
  o.engram_layer_ids = {0, 2};
  o.hc_mult = 2;
  o.hc_sinkhorn_iters = 5;
  o.num_attention_heads = 4;
  o.head_dim = 48;  // Not a multiple of 32: partial scale blocks.
  o.qk_rope_head_dim = 8;
  o.q_lora_rank = 96;
  o.o_lora_rank = 40;
  o.o_groups = 2;
  o.sliding_window = 8;
  o.compress_ratios = {2, 0, 1};
  o.num_routed_experts = 4;
  o.num_experts_per_tok = 3;
  o.n_shared_experts = 2;
  o.moe_intermediate_size = 32;
  o.routed_scaling_factor = 2.5;
  o.swiglu_limit = 0;
  o.rope_theta = 50000;
  ASSERT_TRUE(MakeSyntheticCheckpoint(o).ok());
  testing::ExpectFullModelCheckpoint(o.out_dir, o);
  // The partial blocks decode to values of the same scale as whole ones.
  const std::vector<float> wkv =
      DecodeFp8(o.out_dir, "layers.1.attn.wkv", 48, 64);
  EXPECT_NEAR(Rms(wkv) * std::sqrt(64.0), 1.0, 0.25);
}

TEST(FullModelTest, DeterministicPerSeed) {
  SyntheticCheckpointOptions a = Tiny("seed-a");
  SyntheticCheckpointOptions b = Tiny("seed-b");
  SyntheticCheckpointOptions c = Tiny("seed-c");
  c.seed = 1;
  for (const SyntheticCheckpointOptions* o : {&a, &b, &c}) {
    ASSERT_TRUE(MakeSyntheticCheckpoint(*o).ok());
  }
  const std::map<std::string, std::string> tree_a = ReadTree(a.out_dir);
  EXPECT_EQ(tree_a.size(), 2u + 4u + 1u + 4u);  // Shards, index, json files.
  EXPECT_EQ(tree_a, ReadTree(b.out_dir));
  const std::map<std::string, std::string> tree_c = ReadTree(c.out_dir);
  for (const std::string shard : {"model-00003-of-00007.safetensors",
                                  "model-00007-of-00007.safetensors"}) {
    EXPECT_NE(tree_a.at(shard), tree_c.at(shard)) << shard;
  }
}

TEST(FullModelTest, ValuesHaveSaneScales) {
  const SyntheticCheckpointOptions o = Tiny("scales");
  ASSERT_TRUE(MakeSyntheticCheckpoint(o).ok());
  const std::string& dir = o.out_dir;
  const double d = o.hidden_size;

  // Linear weights ~ N(0, 1) / sqrt(in), each 32 x 32 block's amax mapped
  // into the top binade of e4m3 (224, 448].
  struct Linear {
    const char* name;
    int64_t out, in;
  };
  for (const Linear& l : {Linear{"layers.0.attn.wq_a", 64, 256},
                          Linear{"layers.1.attn.wq_b", 512, 64},
                          Linear{"layers.2.attn.wo_a", 256, 128},
                          Linear{"layers.3.attn.wo_b", 256, 256},
                          Linear{"layers.3.attn.compressor.wgate", 64, 256},
                          Linear{"layers.1.ffn.shared_experts.w2", 256, 64}}) {
    const std::vector<float> w = DecodeFp8(dir, l.name, l.out, l.in);
    EXPECT_NEAR(Rms(w) * std::sqrt(static_cast<double>(l.in)), 1.0, 0.15)
        << l.name;
    const std::vector<uint8_t> codes =
        TensorBytes(dir, std::string(l.name) + ".weight");
    for (int64_t br = 0; br < l.out / 32; ++br) {
      for (int64_t bc = 0; bc < l.in / 32; ++bc) {
        float amax = 0;
        for (int64_t r = br * 32; r < br * 32 + 32; ++r) {
          for (int64_t c = bc * 32; c < bc * 32 + 32; ++c) {
            amax = std::max(
                amax, std::fabs(formats::E4m3ToFloat(codes[r * l.in + c])));
          }
        }
        EXPECT_GT(amax, 224.0f) << l.name << " block " << br << "," << bc;
        EXPECT_LE(amax, 448.0f) << l.name << " block " << br << "," << bc;
      }
    }
  }

  // MXFP4 routed experts: within a factor of two of 1 / sqrt(in).
  for (int w = 1; w <= 3; ++w) {
    const int64_t out = w == 2 ? 256 : 64;
    const int64_t in = w == 2 ? 64 : 256;
    const std::vector<float> v =
        DecodeMxfp4(dir, absl::StrCat("layers.2.ffn.experts.5.w", w), out, in);
    const double gain = Rms(v) * std::sqrt(static_cast<double>(in));
    EXPECT_GT(gain, 0.5) << "w" << w;
    EXPECT_LT(gain, 2.0) << "w" << w;
  }

  // Norm weights ~1, sinks ~0.5 N(0, 1).
  for (const char* name : {"norm.weight", "layers.0.attn_norm.weight",
                           "layers.3.attn.q_norm.weight",
                           "layers.2.attn.compressor.norm.weight"}) {
    const std::vector<float> v = DecodeF32(dir, name);
    EXPECT_NEAR(Mean(v), 1.0, 0.05) << name;
    for (float x : v) EXPECT_GT(x, 0.5f) << name;
  }
  EXPECT_LT(Rms(DecodeF32(dir, "layers.0.attn.attn_sink")), 1.5);

  // Hyper-connections: the pre weights sum to ~1 and post is ~1 when the
  // small mix is ignored; comb logits favour the diagonal.
  const int hc = o.hc_mult;
  const std::vector<float> base = DecodeF32(dir, "layers.1.hc_attn_base");
  double pre_sum = 0;
  for (int i = 0; i < hc; ++i) pre_sum += 1.0 / (1.0 + std::exp(-base[i]));
  EXPECT_NEAR(pre_sum, 1.0, 0.25);
  for (int i = hc; i < 2 * hc; ++i) {
    EXPECT_NEAR(2.0 / (1.0 + std::exp(-base[i])), 1.0, 0.3);
  }
  for (int i = 0; i < hc; ++i) {
    for (int j = 0; j < hc; ++j) {
      if (i != j) {
        EXPECT_GT(base[2 * hc + i * hc + i], base[2 * hc + i * hc + j]);
      }
    }
  }
  const std::vector<float> fn = DecodeF32(dir, "layers.1.hc_attn_fn");
  EXPECT_NEAR(Rms(fn) * std::sqrt(hc * d), 0.1, 0.02);

  // Logits of normalized embeddings: a few units of spread, not saturated.
  const std::vector<float> embed = DecodeBf16(dir, "embed.weight");
  const std::vector<float> head = DecodeBf16(dir, "head.weight");
  const std::vector<float> norm = DecodeF32(dir, "norm.weight");
  const int64_t vocab = SyntheticVocabSize();
  const int64_t dim = o.hidden_size;
  EXPECT_NEAR(Rms(embed), 1.0, 0.1);
  for (int64_t token : {3, 100, 500}) {
    std::vector<double> x(dim);
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i)
      ss += embed[token * dim + i] * embed[token * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int64_t i = 0; i < dim; ++i)
      x[i] = embed[token * dim + i] * inv * norm[i];
    std::vector<double> logits(vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      for (int64_t i = 0; i < dim; ++i) logits[v] += head[v * dim + i] * x[i];
    }
    const double mean =
        std::accumulate(logits.begin(), logits.end(), 0.0) / vocab;
    double var = 0;
    for (double l : logits) var += (l - mean) * (l - mean);
    const double stddev = std::sqrt(var / vocab);
    EXPECT_GT(stddev, 1.5) << "token " << token;
    EXPECT_LT(stddev, 6.0) << "token " << token;
  }

  // The router's bias changes the chosen experts for some inputs, not most.
  const std::vector<float> gate = DecodeBf16(dir, "layers.0.ffn.gate.weight");
  const std::vector<float> bias = DecodeF32(dir, "layers.0.ffn.gate.bias");
  const int experts = o.num_routed_experts;
  int changed = 0;
  const int tokens = 200;
  for (int64_t token = 0; token < tokens; ++token) {
    std::vector<double> score(experts), biased(experts);
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i)
      ss += embed[token * dim + i] * embed[token * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int e = 0; e < experts; ++e) {
      double g = 0;
      for (int64_t i = 0; i < dim; ++i)
        g += gate[e * dim + i] * embed[token * dim + i] * inv;
      score[e] = std::sqrt(std::log1p(std::exp(g)));
      biased[e] = score[e] + bias[e];
    }
    auto top = [&](const std::vector<double>& s) {
      std::vector<int> ids(experts);
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + o.num_experts_per_tok,
                        ids.end(), [&](int a, int b) { return s[a] > s[b]; });
      ids.resize(o.num_experts_per_tok);
      std::sort(ids.begin(), ids.end());
      return ids;
    };
    if (top(score) != top(biased)) ++changed;
  }
  EXPECT_GT(changed, 0);
  EXPECT_LT(changed, tokens / 2);
}

TEST(FullModelTest, DefaultOptionsStayEngramOnly) {
  // Model dimensions are ignored without kFullModel, even invalid ones.
  SyntheticCheckpointOptions a;
  a.out_dir = mneme::testing::MakeTempDir("engram-only-a") + "/ckpt";
  a.threads = 2;
  SyntheticCheckpointOptions b = a;
  b.out_dir = mneme::testing::MakeTempDir("engram-only-b") + "/ckpt";
  b.num_attention_heads = 3;
  b.compress_ratios = {};
  b.num_experts_per_tok = 99;
  ASSERT_TRUE(MakeSyntheticCheckpoint(a).ok());
  ASSERT_TRUE(MakeSyntheticCheckpoint(b).ok());
  EXPECT_EQ(ReadTree(a.out_dir), ReadTree(b.out_dir));
  auto c = checkpoint::ShardedCheckpoint::Create(a.out_dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->shards().size(), 2u);
  for (const auto& [name, location] : (*c)->tensors()) {
    EXPECT_TRUE(absl::StrContains(name, ".engram.")) << name;
  }
  const nlohmann::json config =
      nlohmann::json::parse(ReadFile(a.out_dir + "/config.json"));
  EXPECT_FALSE(config.contains("quantization_config"));
  EXPECT_FALSE(config["text_config"].contains("num_attention_heads"));
  EXPECT_FALSE(config["text_config"].contains("n_routed_experts"));
}

struct BadOption {
  std::string name;
  // The field the message must name.
  std::string field;
  std::function<void(SyntheticCheckpointOptions&)> apply;
};

void PrintTo(const BadOption& b, std::ostream* os) { *os << b.name; }

class FullModelBadOptionsTest : public ::testing::TestWithParam<BadOption> {};

TEST_P(FullModelBadOptionsTest, InvalidArgumentNamingTheField) {
  SyntheticCheckpointOptions o = Tiny("bad");
  GetParam().apply(o);
  const absl::Status status = MakeSyntheticCheckpoint(o);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), GetParam().field)) << status;
  EXPECT_FALSE(std::filesystem::exists(o.out_dir));
  EXPECT_FALSE(std::filesystem::exists(o.out_dir + ".partial"));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, FullModelBadOptionsTest,
    ::testing::Values(
        BadOption{"HeadsNotAMultipleOfGroups", "num_attention_heads",
                  [](auto& o) { o.num_attention_heads = 6; }},
        BadOption{"NoGroups", "o_groups", [](auto& o) { o.o_groups = 0; }},
        BadOption{"OddHeadDim", "head_dim", [](auto& o) { o.head_dim = 63; }},
        BadOption{"HeadDimBelowRope", "head_dim",
                  [](auto& o) { o.head_dim = 8; }},
        BadOption{"OddRopeDim", "qk_rope_head_dim",
                  [](auto& o) { o.qk_rope_head_dim = 15; }},
        BadOption{"NoRopeDim", "qk_rope_head_dim",
                  [](auto& o) { o.qk_rope_head_dim = 0; }},
        BadOption{"NoQLora", "q_lora_rank", [](auto& o) { o.q_lora_rank = 0; }},
        BadOption{"NoOLora", "o_lora_rank", [](auto& o) { o.o_lora_rank = 0; }},
        BadOption{"NoWindow", "sliding_window",
                  [](auto& o) { o.sliding_window = 0; }},
        BadOption{"RatiosTooFew", "compress_ratios",
                  [](auto& o) {
                    o.compress_ratios = {0, 1, 2};
                  }},
        BadOption{"RatioNegative", "compress_ratios",
                  [](auto& o) {
                    o.compress_ratios = {0, 1, -1, 4};
                  }},
        BadOption{"TopKAboveExperts", "num_experts_per_tok",
                  [](auto& o) { o.num_experts_per_tok = 17; }},
        BadOption{"TopKZero", "num_experts_per_tok",
                  [](auto& o) { o.num_experts_per_tok = 0; }},
        BadOption{"NegativeSharedExperts", "n_shared_experts",
                  [](auto& o) { o.n_shared_experts = -1; }},
        BadOption{"ZeroRoutedScaling", "routed_scaling_factor",
                  [](auto& o) { o.routed_scaling_factor = 0; }},
        BadOption{"NanRoutedScaling", "routed_scaling_factor",
                  [](auto& o) {
                    o.routed_scaling_factor =
                        std::numeric_limits<double>::quiet_NaN();
                  }},
        BadOption{"NegativeSwigluLimit", "swiglu_limit",
                  [](auto& o) { o.swiglu_limit = -1; }},
        BadOption{"ZeroRopeTheta", "rope_theta",
                  [](auto& o) { o.rope_theta = 0; }},
        BadOption{"NoSinkhorn", "hc_sinkhorn_iters",
                  [](auto& o) { o.hc_sinkhorn_iters = 0; }},
        BadOption{"ExpertLayers", "expert_layer_ids",
                  [](auto& o) { o.expert_layer_ids = {0}; }},
        BadOption{"DraftStages", "draft_stages",
                  [](auto& o) { o.draft_stages = 1; }},
        BadOption{"HiddenNotAMultipleOf32", "hidden_size",
                  [](auto& o) { o.hidden_size = 48; }},
        BadOption{"IntermediateNotAMultipleOf32", "moe_intermediate_size",
                  [](auto& o) { o.moe_intermediate_size = 48; }},
        BadOption{"NoHc", "hc_mult", [](auto& o) { o.hc_mult = 0; }},
        BadOption{"UnknownContents", "contents",
                  [](auto& o) { o.contents = static_cast<Contents>(7); }}),
    [](const ::testing::TestParamInfo<BadOption>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme::synthetic
