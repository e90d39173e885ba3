#include "tests/tools/synthetic/model_layout_checks.h"

#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/sharded_checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tools/quant/checkpoint_test_util.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic::testing {
namespace {

using checkpoint::DType;

int64_t Blocks(int64_t n) { return (n + 31) / 32; }

// An FP8 linear layer: .weight [out, in] and its 32 x 32 block scales.
void AddFp8(std::map<std::string, ExpectedTensor>& m, const std::string& name,
            int64_t out, int64_t in) {
  m[name + ".weight"] = {DType::kF8E4M3, {out, in}};
  m[name + ".scale"] = {DType::kF8E8M0, {Blocks(out), Blocks(in)}};
}

// An MXFP4 routed expert weight.
void AddMxfp4(std::map<std::string, ExpectedTensor>& m, const std::string& name,
              int64_t out, int64_t in) {
  m[name + ".weight"] = {DType::kU8, {out, in / 2}};
  m[name + ".scale"] = {DType::kF8E8M0, {out, in / 32}};
}

}  // namespace

std::map<std::string, ExpectedTensor> ExpectedModelTensors(
    const SyntheticCheckpointOptions& o,
    const std::vector<int64_t>& engram_rows) {
  std::map<std::string, ExpectedTensor> m;
  const int64_t v = SyntheticVocabSize();
  const int64_t d = o.hidden_size;
  const int64_t hc = o.hc_mult;
  const int64_t h = o.num_attention_heads;
  const int64_t hd = o.head_dim;
  const int64_t g = o.o_groups;
  const int64_t e = o.num_routed_experts;
  const int64_t inter = o.moe_intermediate_size;
  m["embed.weight"] = {DType::kBf16, {v, d}};
  m["head.weight"] = {DType::kBf16, {v, d}};
  m["norm.weight"] = {DType::kF32, {d}};
  if (hc > 1) {
    m["hc_head_fn"] = {DType::kF32, {hc, hc * d}};
    m["hc_head_base"] = {DType::kF32, {hc}};
    m["hc_head_scale"] = {DType::kF32, {1}};
  }
  for (int layer = 0; layer < o.num_hidden_layers; ++layer) {
    const std::string p = absl::StrCat("layers.", layer, ".");
    m[p + "attn_norm.weight"] = {DType::kF32, {d}};
    m[p + "ffn_norm.weight"] = {DType::kF32, {d}};
    if (hc > 1) {
      for (const char* site : {"attn", "ffn"}) {
        const std::string s = absl::StrCat(p, "hc_", site, "_");
        m[s + "fn"] = {DType::kF32, {(2 + hc) * hc, hc * d}};
        m[s + "base"] = {DType::kF32, {(2 + hc) * hc}};
        m[s + "scale"] = {DType::kF32, {3}};
      }
    }
    AddFp8(m, p + "attn.wq_a", o.q_lora_rank, d);
    m[p + "attn.q_norm.weight"] = {DType::kF32, {o.q_lora_rank}};
    AddFp8(m, p + "attn.wq_b", h * hd, o.q_lora_rank);
    AddFp8(m, p + "attn.wkv", hd, d);
    m[p + "attn.kv_norm.weight"] = {DType::kF32, {hd}};
    AddFp8(m, p + "attn.wo_a", g * o.o_lora_rank, h / g * hd);
    AddFp8(m, p + "attn.wo_b", d, g * o.o_lora_rank);
    m[p + "attn.attn_sink"] = {DType::kF32, {h}};
    if (const int64_t r = o.compress_ratios[layer]; r > 0) {
      AddFp8(m, p + "attn.compressor.wkv", hd, d);
      AddFp8(m, p + "attn.compressor.wgate", hd, d);
      m[p + "attn.compressor.ape"] = {DType::kF32, {r, hd}};
      m[p + "attn.compressor.norm.weight"] = {DType::kF32, {hd}};
    }
    m[p + "ffn.gate.weight"] = {DType::kBf16, {e, d}};
    m[p + "ffn.gate.bias"] = {DType::kF32, {e}};
    for (int64_t x = 0; x < e; ++x) {
      const std::string ex = absl::StrCat(p, "ffn.experts.", x, ".");
      AddMxfp4(m, ex + "w1", inter, d);
      AddMxfp4(m, ex + "w2", d, inter);
      AddMxfp4(m, ex + "w3", inter, d);
    }
    if (o.n_shared_experts > 0) {
      const int64_t shared = o.n_shared_experts * inter;
      AddFp8(m, p + "ffn.shared_experts.w1", shared, d);
      AddFp8(m, p + "ffn.shared_experts.w2", d, shared);
      AddFp8(m, p + "ffn.shared_experts.w3", shared, d);
    }
  }
  const bool nvfp4 = o.engram_format == formats::RowFormat::kNvfp4;
  for (size_t i = 0; i < o.engram_layer_ids.size(); ++i) {
    const std::string p =
        absl::StrCat("layers.", o.engram_layer_ids[i], ".engram.");
    const int64_t rows = i < engram_rows.size() ? engram_rows[i] : -1;
    m[p + "embed.weight"] = {nvfp4 ? DType::kU8 : DType::kF8E4M3,
                             {rows, nvfp4 ? 128 : 256}};
    m[p + "embed.scale"] = {nvfp4 ? DType::kF8E4M3 : DType::kF8E8M0,
                            {rows, nvfp4 ? 16 : 8}};
    AddFp8(m, p + "wkv", (hc + 1) * d, 6144);
    m[p + "q_weight"] = {DType::kBf16, {hc, d}};
    m[p + "k_weight"] = {DType::kBf16, {hc, d}};
  }
  return m;
}

void ExpectFullModelCheckpoint(const std::string& dir,
                               const SyntheticCheckpointOptions& o) {
  // Non-const: a missing key reads as null and fails the comparison.
  nlohmann::json config =
      nlohmann::json::parse(quant::testing::ReadFile(dir + "/config.json"));
  nlohmann::json t = config["text_config"];
  const std::vector<int64_t> rows =
      t["engram_num_embeddings"].get<std::vector<int64_t>>();
  const std::map<std::string, ExpectedTensor> want =
      ExpectedModelTensors(o, rows);

  absl::StatusOr<std::unique_ptr<checkpoint::ShardedCheckpoint>> c =
      checkpoint::ShardedCheckpoint::Create(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->index().has_value());
  std::set<std::string> names;
  for (const auto& [name, shard] : (*c)->index()->weight_map) {
    names.insert(name);
  }
  std::set<std::string> want_names;
  for (const auto& [name, tensor] : want) want_names.insert(name);
  EXPECT_EQ(names, want_names);
  for (const auto& [name, tensor] : want) {
    const checkpoint::TensorLocation* got = (*c)->FindOrNull(name);
    if (got == nullptr) continue;  // Reported above.
    EXPECT_EQ(checkpoint::DTypeName(got->info->dtype),
              checkpoint::DTypeName(tensor.dtype))
        << name;
    EXPECT_EQ(got->info->shape, tensor.shape) << name;
  }

  // Shards: one per Engram layer, one per layer, one for the rest.
  const std::map<std::string, std::string>& shard_of =
      (*c)->index()->weight_map;
  EXPECT_EQ((*c)->shards().size(),
            o.engram_layer_ids.size() + o.num_hidden_layers + 1);
  std::set<std::string> layer_shards;
  for (int layer = 0; layer < o.num_hidden_layers; ++layer) {
    const std::string prefix = absl::StrCat("layers.", layer, ".");
    const std::string shard = shard_of.at(prefix + "attn.wq_a.weight");
    layer_shards.insert(shard);
    for (const auto& [name, s] : shard_of) {
      if (absl::StartsWith(name, prefix) &&
          !absl::StrContains(name, ".engram.")) {
        EXPECT_EQ(s, shard) << name;
      } else {
        EXPECT_NE(s, shard) << name;
      }
    }
  }
  EXPECT_EQ(layer_shards.size(), static_cast<size_t>(o.num_hidden_layers));
  for (const char* name : {"head.weight", "norm.weight"}) {
    EXPECT_EQ(shard_of.at(name), shard_of.at("embed.weight")) << name;
  }

  // config.json: every key of MODEL_LAYOUT.md's table.
  EXPECT_EQ(t["vocab_size"], SyntheticVocabSize());
  EXPECT_EQ(t["hidden_size"], o.hidden_size);
  EXPECT_EQ(t["num_hidden_layers"], o.num_hidden_layers);
  EXPECT_EQ(t["hc_mult"], o.hc_mult);
  EXPECT_EQ(t["hc_sinkhorn_iters"], o.hc_sinkhorn_iters);
  EXPECT_DOUBLE_EQ(t.value("hc_eps", -1.0), 1e-6);
  EXPECT_DOUBLE_EQ(t.value("rms_norm_eps", -1.0), 1e-6);
  EXPECT_EQ(t["num_attention_heads"], o.num_attention_heads);
  EXPECT_EQ(t["head_dim"], o.head_dim);
  EXPECT_EQ(t["qk_rope_head_dim"], o.qk_rope_head_dim);
  EXPECT_DOUBLE_EQ(t.value("rope_theta", -1.0), o.rope_theta);
  EXPECT_EQ(t["q_lora_rank"], o.q_lora_rank);
  EXPECT_EQ(t["o_lora_rank"], o.o_lora_rank);
  EXPECT_EQ(t["o_groups"], o.o_groups);
  EXPECT_EQ(t["sliding_window"], o.sliding_window);
  EXPECT_EQ(t["compress_ratios"].get<std::vector<int>>(), o.compress_ratios);
  EXPECT_EQ(t["n_routed_experts"], o.num_routed_experts);
  EXPECT_EQ(t["num_experts_per_tok"], o.num_experts_per_tok);
  EXPECT_EQ(t["n_shared_experts"], o.n_shared_experts);
  EXPECT_EQ(t["moe_intermediate_size"], o.moe_intermediate_size);
  EXPECT_DOUBLE_EQ(t.value("routed_scaling_factor", -1.0),
                   o.routed_scaling_factor);
  EXPECT_DOUBLE_EQ(t.value("swiglu_limit", -1.0), o.swiglu_limit);
  EXPECT_EQ(t["engram_layer_ids"].get<std::vector<int>>(), o.engram_layer_ids);
  EXPECT_EQ(config["quantization_config"],
            nlohmann::json::parse(R"({"quant_method": "fp8", "fmt": "e4m3",
                "scale_fmt": "ue8m0", "weight_block_size": [32, 32]})"));
}

}  // namespace mneme::synthetic::testing
