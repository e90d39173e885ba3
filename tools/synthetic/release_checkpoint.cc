#include "tools/synthetic/release_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/gridbook_artifact.h"
#include "checkpoint/safetensors_writer.h"
#include "common/file_io.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/primes.h"
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"
#include "formats/row_encode.h"
#include "formats/row_format.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/synthetic_checkpoint.h"
#include "tools/synthetic/synthetic_internal.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic {
namespace {

namespace fs = std::filesystem;
using checkpoint::DType;
using synthetic_internal::SplitMix;

// --- Dimensions ---

struct Dims {
  ReleaseArch arch = ReleaseArch::kV41Flash;
  bool full = false;
  int64_t vocab = 0, d = 0, heads = 0, hd = 0, rope = 0, q_lora = 0;
  int64_t o_lora = 0, groups = 0, window = 0;
  int layers = 0, stages = 0, hash_layers = 0, hc = 4;
  std::vector<int> ratios;  // layers + stages entries
  int64_t n_i = 0, d_i = 0, index_topk = 0;
  int64_t experts = 0, topk = 0, inter = 0;
  int64_t block = 128;  // FP8 block side
  // DSpark (0731, V4.1).
  int64_t dspark_experts = 0, dspark_topk = 0, markov_rank = 0;
  int64_t dspark_block = 5, noise_token = 0;
  std::vector<int> targets;
  // V4.1.
  std::vector<int> kv_src, idx_src;
  int cand_src = -1, cand_blocks = 0, cand_bs = 0;
  std::vector<int> engram_layers;
  std::vector<int64_t> engram_rows;
  int64_t engram_vocab = 0, engram_compressed = 0;
  // V4.1 vision tower (ViT + aligner).
  int vision_layers = 0;
  int64_t vision_dim = 0, vision_heads = 0, vision_inter = 0;
  int64_t vision_patch = 14, vision_downsample = 3;
  // ReleaseCheckpointOptions::aligned_draft.
  bool aligned = false;
  // ReleaseCheckpointOptions::experts_format.
  ExpertsFormat experts_format = ExpertsFormat::kMxfp4;
};

// GridBook experts: the routed rung (NVFP4_CB_K16), the shared rung
// (FP8_CB_K36), the routed experts' input_global_scale (activations up to
// |x| ~ 21 keep their e4m3 group scales below 448), and the intermediate size
// of the tiny models with GridBook experts (a multiple of the 256-value
// superblock, for down_proj's input).
constexpr int kGridbookFp4Bits = 16;
constexpr int kGridbookFp8Bits = 36;
constexpr float kGridbookInputScale = 128.0f;
constexpr int64_t kGridbookIntermediate = 256;

// Aligned drafts (ReleaseCheckpointOptions::aligned_draft): the gain of the
// embedding, the gain of the main layers' output projections, and the
// exponent step of their experts' down projections.
constexpr float kAlignedEmbedGain = 16.0f;
constexpr float kAlignedOutputGain = 1.0f / 32;
constexpr int kAlignedExpertStep = 5;

bool IsDspark(const Dims& m) { return m.arch != ReleaseArch::kV4Flash; }
bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// V4 compress pattern: 0 for layers 0, 1, then 4 (even) / 128 (odd), then a
// 0 per MTP / DSpark stage.
std::vector<int> V4Ratios(int layers, int stages) {
  std::vector<int> r;
  r.reserve(layers + stages);
  for (int i = 0; i < layers; ++i)
    r.push_back(i < 2 ? 0 : i % 2 == 0 ? 4 : 128);
  for (int i = 0; i < stages; ++i) r.push_back(0);
  return r;
}

Dims MakeDims(ReleaseArch arch, bool full) {
  Dims m;
  m.arch = arch;
  m.full = full;
  if (arch == ReleaseArch::kV41Flash) {
    m.block = 32;
    m.stages = 3;
    m.dspark_topk = 3;
    if (full) {
      m.vocab = 129280, m.d = 5120, m.layers = 40, m.heads = 64, m.hd = 512;
      m.rope = 64, m.q_lora = 1280, m.o_lora = 1024, m.groups = 8;
      m.window = 128, m.n_i = 32, m.d_i = 128, m.index_topk = 512;
      m.experts = 384, m.topk = 6, m.inter = 2304, m.dspark_experts = 128;
      m.markov_rank = 256, m.noise_token = 128799, m.targets = {37, 38, 39};
      m.ratios.assign({0, 0});
      for (int i = 0; i < 18; ++i) m.ratios.push_back(2);
      for (int i = 0; i < 20; ++i) m.ratios.push_back(1);
      for (int i = 0; i < 3; ++i) m.ratios.push_back(0);
      m.kv_src = {2, 8, 14, 20};
      m.idx_src = {2, 8, 14, 20, 24, 28, 32, 36};
      m.cand_src = 20, m.cand_blocks = 2048, m.cand_bs = 8;
      m.engram_layers = {1, 14};
      m.engram_rows = {384006168, 384016682};
      m.engram_vocab = 16000000, m.engram_compressed = 99092;
      m.vision_layers = 32, m.vision_dim = 1024, m.vision_heads = 16;
      m.vision_inter = 2816;
    } else {
      m.vocab = SyntheticVocabSize(), m.d = 256, m.layers = 9, m.heads = 8;
      m.hd = 128, m.rope = 64, m.q_lora = 128, m.o_lora = 64, m.groups = 4;
      m.window = 16, m.n_i = 4, m.d_i = 128, m.index_topk = 16;
      m.experts = 16, m.topk = 6, m.inter = 128, m.dspark_experts = 8;
      m.markov_rank = 32, m.noise_token = SyntheticVocabSize() - 1;
      m.targets = {6, 7, 8};
      m.ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 0, 0, 0};
      m.kv_src = {2, 4, 6};
      m.idx_src = {2, 4, 6, 8};
      m.cand_src = 6, m.cand_blocks = 8, m.cand_bs = 4;
      m.engram_layers = {1, 3};
      m.vision_layers = 2, m.vision_dim = 64, m.vision_heads = 4;
      m.vision_inter = 128;
    }
    return m;
  }
  m.block = 128;
  m.hash_layers = 3;
  m.stages = arch == ReleaseArch::kV4Flash ? 1 : 3;
  if (full) {
    m.vocab = 129280, m.d = 4096, m.layers = 43, m.heads = 64, m.hd = 512;
    m.rope = 64, m.q_lora = 1024, m.o_lora = 1024, m.groups = 8;
    m.window = 128, m.n_i = 64, m.d_i = 128, m.index_topk = 512;
    m.experts = arch == ReleaseArch::kV4Flash ? 256 : 160;
    m.topk = 6, m.inter = 2048;
    m.markov_rank = 256, m.noise_token = 128799, m.targets = {40, 41, 42};
  } else {
    m.vocab = SyntheticVocabSize(), m.d = 256, m.layers = 5, m.heads = 8;
    m.hd = 128, m.rope = 64, m.q_lora = 128, m.o_lora = 128, m.groups = 4;
    m.window = 16, m.n_i = 8, m.d_i = 128, m.index_topk = 16;
    m.experts = 16, m.topk = 6, m.inter = 128;
    m.markov_rank = 32, m.noise_token = SyntheticVocabSize() - 1;
    m.targets = {2, 3, 4};
  }
  m.dspark_experts = m.experts;  // 0731: the stages use the main MoE config.
  m.dspark_topk = m.topk;
  m.ratios = V4Ratios(m.layers, m.stages);
  return m;
}

// --- Configs ---

nlohmann::json RopeScaling() {
  return {{"beta_fast", 32},
          {"beta_slow", 1},
          {"factor", 16},
          {"original_max_position_embeddings", 65536},
          {"type", "yarn"}};
}

// V4-Flash / 0731: HF keys at the top level, as the 0731 config.json.
nlohmann::json V4Config(const Dims& m) {
  nlohmann::json c = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", kBosTokenId},
      {"compress_ratios", m.ratios},
      {"compress_rope_theta", 160000},
      {"eos_token_id", kEosTokenId},
      {"expert_dtype", "fp4"},
      {"hc_eps", 1e-6},
      {"hc_mult", m.hc},
      {"hc_sinkhorn_iters", 20},
      {"head_dim", m.hd},
      {"hidden_act", "silu"},
      {"hidden_size", m.d},
      {"index_head_dim", m.d_i},
      {"index_n_heads", m.n_i},
      {"index_topk", m.index_topk},
      {"initializer_range", 0.02},
      {"max_position_embeddings", 1048576},
      {"model_type", "deepseek_v4"},
      {"moe_intermediate_size", m.inter},
      {"n_routed_experts", m.experts},
      {"n_shared_experts", 1},
      {"norm_topk_prob", true},
      {"num_attention_heads", m.heads},
      {"num_experts_per_tok", m.topk},
      {"num_hash_layers", m.hash_layers},
      {"num_hidden_layers", m.layers},
      {"num_key_value_heads", 1},
      // The 0731 release keeps 1 here although it has three DSpark stages
      // (compress_ratios has num_hidden_layers + 3 entries).
      {"num_nextn_predict_layers", 1},
      {"o_groups", m.groups},
      {"o_lora_rank", m.o_lora},
      {"q_lora_rank", m.q_lora},
      {"qk_rope_head_dim", m.rope},
      {"quantization_config",
       {{"activation_scheme", "dynamic"},
        {"fmt", "e4m3"},
        {"quant_method", "fp8"},
        {"scale_fmt", "ue8m0"},
        {"weight_block_size", {m.block, m.block}}}},
      {"rms_norm_eps", 1e-6},
      {"rope_scaling", RopeScaling()},
      {"rope_theta", 10000},
      {"routed_scaling_factor", 1.5},
      {"scoring_func", "sqrtsoftplus"},
      {"sliding_window", m.window},
      {"swiglu_limit", 10.0},
      {"tie_word_embeddings", false},
      {"topk_method", "noaux_tc"},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.57.1"},
      {"use_cache", true},
      {"vocab_size", m.vocab},
  };
  if (IsDspark(m)) {
    c["dspark_block_size"] = m.dspark_block;
    c["dspark_markov_rank"] = m.markov_rank;
    c["dspark_noise_token_id"] = m.noise_token;
    c["dspark_target_layer_ids"] = m.targets;
  }
  return c;
}

nlohmann::ordered_json V41Config(const Dims& m,
                                 const std::vector<int64_t>& engram_rows,
                                 int64_t engram_vocab,
                                 int64_t compressed_vocab) {
  nlohmann::ordered_json t = {
      {"model_type", "deepseek_v41"},
      {"vocab_size", m.vocab},
      {"hidden_size", m.d},
      {"num_hidden_layers", m.layers},
      {"num_attention_heads", m.heads},
      {"num_key_value_heads", 1},
      {"head_dim", m.hd},
      {"qk_rope_head_dim", m.rope},
      {"q_lora_rank", m.q_lora},
      {"o_lora_rank", m.o_lora},
      {"o_groups", m.groups},
      {"sliding_window", m.window},
      {"compress_ratios", m.ratios},
      {"kv_source_layer_ids", m.kv_src},
      {"index_source_layer_ids", m.idx_src},
      {"candidate_source_layer_id", m.cand_src},
      {"candidate_topk_blocks", m.cand_blocks},
      {"candidate_block_size", m.cand_bs},
      {"index_n_heads", m.n_i},
      {"index_head_dim", m.d_i},
      {"index_topk", m.index_topk},
      {"rope_theta", 10000},
      {"compress_rope_theta", 160000},
      {"rope_scaling", RopeScaling()},
      {"max_position_embeddings", 1048576},
      {"rms_norm_eps", 1e-20},
      {"n_routed_experts", m.experts},
      {"num_experts_per_tok", m.topk},
      {"n_shared_experts", 1},
      {"moe_intermediate_size", m.inter},
      {"scoring_func", "sqrtsoftplus"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", 1.5},
      {"swiglu_limit", 10.0},
      {"hc_mult", m.hc},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"engram_layer_ids", m.engram_layers},
      {"engram_num_embeddings", engram_rows},
      {"engram_max_ngram_size", synthetic_internal::kMaxNgramSize},
      {"engram_n_heads", synthetic_internal::kHeads},
      {"engram_head_dim", formats::kRowDim},
      {"engram_vocab_size", engram_vocab},
      {"engram_compressed_vocab_size", compressed_vocab},
      {"engram_pad_token_id", kPadTokenId},
      {"num_nextn_predict_layers", m.stages},
      {"dspark_block_size", m.dspark_block},
      {"dspark_noise_token_id", m.noise_token},
      {"dspark_target_layer_ids", m.targets},
      {"dspark_markov_rank", m.markov_rank},
      {"dspark_n_routed_experts", m.dspark_experts},
      {"dspark_num_experts_per_tok", m.dspark_topk},
      {"image_token_id", m.full ? 129264 : kPadTokenId},
      {"bos_token_id", kBosTokenId},
      {"eos_token_id", kEosTokenId},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
  };
  nlohmann::ordered_json vision = {
      {"num_hidden_layers", m.vision_layers},
      {"hidden_size", m.vision_dim},
      {"num_attention_heads", m.vision_heads},
      {"intermediate_size", m.vision_inter},
      {"patch_size", m.vision_patch},
      {"downsample_ratio", m.vision_downsample},
      {"rope_theta", 10000},
      {"max_n_token", 1024},
      {"min_pixels", 295936},
  };
  return {
      {"architectures", {"DeepseekV41ForCausalLM"}},
      {"model_type", "deepseek_v41"},
      {"text_config", t},
      {"vision_config", vision},
      {"quantization_config",
       {{"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"activation_scheme", "dynamic"},
        {"scale_fmt", "ue8m0"},
        {"weight_block_size", {m.block, m.block}},
        {"expert_dtype", "fp4"}}},
  };
}

// --- Tensor plan ---

enum class Init {
  kNorm,       // BF16 1 + 0.05 N(0, 1)
  kNormal,     // BF16 / F32 mean + stddev N(0, 1)
  kHcBase,     // F32 [mix]: pre ~ 1 / hc, post ~ 1, comb favouring identity
  kHeadBase,   // F32 [hc]: pre ~ 1 / hc
  kFp8,        // .weight F8_E4M3 then .scale F8_E8M0 (two entries)
  kFp4,        // .weight I8 then .scale F8_E8M0 (two entries)
  kTid2eid,    // I64 [V, k], k distinct experts per row
  kEngram,     // Engram tensors: written by the Engram writer
  kCopy,       // BF16: columns [0, cols) of `source` (times `scale`'s values)
  kBits,       // any dtype: uniformly random bytes (EXL3 trellis)
  kSigned,     // F16: random sign x stddev x uniform [0.75, 1.25)
  kMarker,     // I32 []: the value `experts` (EXL3 codebook markers)
  kCodewords,  // U8 [..., rows, blocks * type_size]: GridBook superblocks
};

struct TensorPlan {
  checkpoint::TensorDecl decl;
  Init init = Init::kNormal;
  float mean = 0.0f;
  float stddev = 0.0f;
  // kFp4: UE8M0 exponent the block scales are drawn around.
  int exponent = 127;
  // kTid2eid: number of experts to draw from.
  int64_t experts = 0;
  // kNormal: columns past this (> 0) are 0.
  int64_t keep_cols = 0;
  // kCodewords: bits per codeword; two-tier scale planes with exponents
  // `exponent` or one above (false: no plane, an fp8 rung).
  int codeword_bits = 0;
  bool two_tier = false;
  // kCopy: the tensors whose values are copied (BF16-rounded as written)
  // and multiplied per column.
  std::shared_ptr<const TensorPlan> source, scale;
};

struct ShardPlan {
  std::vector<TensorPlan> tensors;
  int engram_layer = -1;  // >= 0: the Engram shard of this layer
  int engram_index = 0;
  int64_t engram_rows = 0;
};

class Planner {
 public:
  Planner(const Dims& m, formats::RowFormat engram_format)
      : m_(m), engram_format_(engram_format) {}

  void Norm(const std::string& name, int64_t dim) {
    Add({name, DType::kBf16, {dim}}, Init::kNorm, 1.0f, 0.05f);
  }
  void Bf16(const std::string& name, std::vector<int64_t> shape, float sd) {
    Add({name, DType::kBf16, std::move(shape)}, Init::kNormal, 0.0f, sd);
  }
  void F32(const std::string& name, std::vector<int64_t> shape, float mean,
           float sd) {
    Add({name, DType::kF32, std::move(shape)}, Init::kNormal, mean, sd);
  }
  // FP8 linear `prefix` [out, in] with the arch's square blocks.
  void Fp8(const std::string& prefix, int64_t out, int64_t in,
           float gain = 1.0f) {
    const int64_t b = m_.block;
    Add({prefix + ".weight", DType::kF8E4M3, {out, in}}, Init::kFp8, 0.0f,
        gain / std::sqrt(static_cast<float>(in)));
    Add({prefix + ".scale",
         DType::kF8E8M0,
         {(out + b - 1) / b, (in + b - 1) / b}},
        Init::kFp8, 0.0f, 0.0f);
  }
  // MXFP4 linear: I8 [out, in / 2] + E8M0 [out, in / 32].
  void Fp4(const std::string& prefix, int64_t out, int64_t in, int exponent) {
    Add({prefix + ".weight", DType::kI8, {out, in / 2}}, Init::kFp4, 0, 0);
    tensors().back().exponent = exponent;
    Add({prefix + ".scale", DType::kF8E8M0, {out, in / 32}}, Init::kFp4, 0, 0);
    tensors().back().exponent = exponent;
  }
  // EXL3 linear `prefix` [out, in] (y = x W^T): .trellis I16
  // [in / 16, out / 16, 16 bits], .suh F16 [in], .svh F16 [out] and the
  // codebook's marker; rms(W) ~ gain / sqrt(in).
  void Exl3(const std::string& prefix, int64_t out, int64_t in, int bits,
            formats::exl3::Codebook codebook, float gain) {
    Add({prefix + ".trellis",
         DType::kI16,
         {in / 16, out / 16, int64_t{16} * bits}},
        Init::kBits, 0, 0);
    // The codebooks' values have rms ~1.24 (3inst, mcg) or ~1.0 (mul1);
    // the Hadamard transforms keep it.
    const float rms = codebook == formats::exl3::Codebook::kMul1 ? 1.0f : 1.24f;
    Add({prefix + ".suh", DType::kF16, {in}}, Init::kSigned, 0,
        gain / std::sqrt(static_cast<float>(in)) / rms);
    Add({prefix + ".svh", DType::kF16, {out}}, Init::kSigned, 0, 1.0f);
    if (codebook == formats::exl3::Codebook::kMcg) {
      Add({prefix + ".mcg", DType::kI32, {}}, Init::kMarker, 0, 0);
      tensors().back().experts =
          static_cast<int64_t>(0xCBAC1FEDu) - (1LL << 32);
    } else if (codebook == formats::exl3::Codebook::kMul1) {
      Add({prefix + ".mul1", DType::kI32, {}}, Init::kMarker, 0, 0);
      tensors().back().experts =
          static_cast<int64_t>(0x83DCD12Du) - (1LL << 32);
    }
  }
  // GridBook superblocks of a codebook rung (random codewords; two-tier
  // planes around 2^(exponent - 127) for fp4).
  void Codewords(const std::string& name, std::vector<int64_t> shape, int k,
                 bool two_tier, int exponent) {
    Add({name, DType::kU8, std::move(shape)}, Init::kCodewords, 0, 0);
    tensors().back().codeword_bits = k;
    tensors().back().two_tier = two_tier;
    tensors().back().exponent = exponent;
  }
  // GridBook experts of a main layer (ExpertsFormat::kGridbook): the routed
  // experts stacked as NVFP4_CB_K16 (two-tier scales, W4A4 contract), the
  // shared experts as dense FP8_CB_K36 with per-row weight_scale.
  void GridbookExperts(const std::string& f, int64_t experts) {
    const Dims& m = m_;
    const int64_t ts4 = 4 * kGridbookFp4Bits + 9;
    const int64_t ts8 = int64_t{4} * kGridbookFp8Bits;
    // E2M1 table values have rms ~2.9; T[c] ~2: 2^-7 * 2 * 2.9 ~ 1 / 16.
    Codewords(f + "experts.gate_up_proj.cb_qweight",
              {experts, 2 * m.inter, m.d / 256 * ts4}, kGridbookFp4Bits, true,
              127 - 7 - (m.d > 256 ? 1 : 0));
    F32(f + "experts.gate_up_proj.input_global_scale", {1}, kGridbookInputScale,
        0.0f);
    Codewords(f + "experts.down_proj.cb_qweight",
              {experts, m.d, m.inter / 256 * ts4}, kGridbookFp4Bits, true,
              127 - 7 - (m.inter > 256 ? 1 : 0));
    F32(f + "experts.down_proj.input_global_scale", {1}, kGridbookInputScale,
        0.0f);
    for (const auto& [w, out, in] :
         {std::tuple{"w1", m.inter, m.d}, std::tuple{"w2", m.d, m.inter},
          std::tuple{"w3", m.inter, m.d}}) {
      const std::string x = absl::StrCat(f, "shared_experts.", w);
      Codewords(x + ".cb_qweight", {out, in / 256 * ts8}, kGridbookFp8Bits,
                false, 0);
      // Table values ~N(0, 1) as e4m3: the row scale sets the gain.
      const float gain = 1.0f / std::sqrt(static_cast<float>(in));
      F32(x + ".weight_scale", {out}, gain, 0.1f * gain);
    }
    gridbook_layers_.push_back(f);
  }
  const std::vector<std::string>& gridbook_layers() const {
    return gridbook_layers_;
  }
  void HcMix(const std::string& prefix) {
    const int64_t mix = int64_t{2 + m_.hc} * m_.hc;
    const int64_t in = m_.hc * m_.d;
    F32(prefix + "_fn", {mix, in}, 0.0f,
        0.1f / std::sqrt(static_cast<float>(in)));
    Add({prefix + "_base", DType::kF32, {mix}}, Init::kHcBase, 0.0f, 0.1f);
    F32(prefix + "_scale", {3}, 1.0f, 0.1f);
  }
  void HcHead(const std::string& prefix) {
    const int64_t in = m_.hc * m_.d;
    F32(prefix + "hc_head_fn", {m_.hc, in}, 0.0f,
        0.1f / std::sqrt(static_cast<float>(in)));
    Add({prefix + "hc_head_base", DType::kF32, {m_.hc}}, Init::kHeadBase, 0.0f,
        0.1f);
    F32(prefix + "hc_head_scale", {1}, 1.0f, 0.1f);
  }

  void NewShard() { shards_.emplace_back(); }
  std::vector<TensorPlan>& tensors() { return shards_.back().tensors; }
  void Add(checkpoint::TensorDecl decl, Init init, float mean, float sd) {
    TensorPlan t;
    t.decl = std::move(decl);
    t.init = init;
    t.mean = mean;
    t.stddev = sd;
    tensors().push_back(std::move(t));
  }
  std::vector<ShardPlan>& shards() { return shards_; }

  // One block: main layer `layer` (< layers) or stage layer - layers.
  void Block(const std::string& p, int layer) {
    const Dims& m = m_;
    const bool main = layer < m.layers;
    const float inv_d = 1.0f / std::sqrt(static_cast<float>(m.d));
    Norm(p + "attn_norm.weight", m.d);
    Norm(p + "ffn_norm.weight", m.d);
    HcMix(p + "hc_attn");
    HcMix(p + "hc_ffn");
    const std::string a = p + "attn.";
    F32(a + "attn_sink", {m.heads}, 0.0f, 0.5f);
    Fp8(a + "wq_a", m.q_lora, m.d);
    Norm(a + "q_norm.weight", m.q_lora);
    Fp8(a + "wq_b", m.heads * m.hd, m.q_lora);
    Fp8(a + "wkv", m.hd, m.d);
    Norm(a + "kv_norm.weight", m.hd);
    Fp8(a + "wo_a", m.groups * m.o_lora, m.heads * m.hd / m.groups);
    // Aligned drafts: the main layers barely move the stream.
    const float out_gain = main && m.aligned ? kAlignedOutputGain : 1.0f;
    Fp8(a + "wo_b", m.d, m.groups * m.o_lora, out_gain);
    const int ratio = m.ratios[layer];
    if (m.arch == ReleaseArch::kV41Flash) {
      if (main && Contains(m.kv_src, layer)) {
        Bf16(a + "compressor.wkv.weight", {m.hd, m.d}, inv_d);
        if (ratio > 1) Bf16(a + "compressor.wgate.weight", {m.hd, m.d}, inv_d);
        Norm(a + "compressor.norm.weight", m.hd);
      }
      if (main && Contains(m.idx_src, layer)) {
        Fp8(a + "indexer.wq_b", m.n_i * m.d_i, m.q_lora);
        Bf16(a + "indexer.weights_proj.weight", {m.n_i, m.d}, inv_d);
        if (Contains(m.kv_src, layer)) {
          Bf16(a + "indexer.wk.weight", {m.d_i, m.hd},
               1.0f / std::sqrt(static_cast<float>(m.hd)));
          Norm(a + "indexer.k_norm.weight", m.d_i);
        }
      }
    } else if (ratio > 0) {
      const int64_t c = ratio == 4 ? 2 : 1;
      F32(a + "compressor.ape", {ratio, c * m.hd}, 0.0f, 0.1f);
      Bf16(a + "compressor.wkv.weight", {c * m.hd, m.d}, inv_d);
      Bf16(a + "compressor.wgate.weight", {c * m.hd, m.d}, inv_d);
      Norm(a + "compressor.norm.weight", m.hd);
      if (ratio == 4) {
        Fp8(a + "indexer.wq_b", m.n_i * m.d_i, m.q_lora);
        Bf16(a + "indexer.weights_proj.weight", {m.n_i, m.d}, inv_d);
        const std::string ic = a + "indexer.compressor.";
        F32(ic + "ape", {4, 2 * m.d_i}, 0.0f, 0.1f);
        Bf16(ic + "wkv.weight", {2 * m.d_i, m.d}, inv_d);
        Bf16(ic + "wgate.weight", {2 * m.d_i, m.d}, inv_d);
        Norm(ic + "norm.weight", m.d_i);
      }
    }
    const std::string f = p + "ffn.";
    const int64_t experts = main ? m.experts : m.dspark_experts;
    Bf16(f + "gate.weight", {experts, m.d}, inv_d);
    if (main && layer < m.hash_layers) {
      Add({f + "gate.tid2eid", DType::kI64, {m.vocab, m.topk}}, Init::kTid2eid,
          0.0f, 0.0f);
      tensors().back().experts = experts;
    } else {
      F32(f + "gate.bias", {experts}, 0.0f, 0.03f);
      if (m.arch == ReleaseArch::kV41Flash) {
        F32(f + "gate.bias_vl", {experts}, 0.0f, 0.03f);
      }
    }
    const int up = synthetic_internal::UnitGainExponent(m.d);
    const int down = synthetic_internal::UnitGainExponent(m.inter);
    if (m.experts_format == ExpertsFormat::kGridbook && main) {
      GridbookExperts(f, experts);
      return;
    }
    if (m.experts_format == ExpertsFormat::kExl3) {
      // The codebook cycles over the experts, the bits over the experts and
      // projections; e = 3 (mod 8) has 4x larger w1 / w3 as below.
      constexpr formats::exl3::Codebook kCodebooks[] = {
          formats::exl3::Codebook::kMcg, formats::exl3::Codebook::kMul1,
          formats::exl3::Codebook::k3Inst};
      for (int64_t e = 0; e <= experts; ++e) {
        const bool shared = e == experts;
        const std::string x = shared ? f + "shared_experts."
                                     : absl::StrCat(f, "experts.", e, ".");
        const float boost = !shared && e % 8 == 3 ? 4.0f : 1.0f;
        const auto codebook = kCodebooks[e % 3];
        Exl3(x + "w1", m.inter, m.d, 2 + static_cast<int>(e % 4), codebook,
             boost);
        Exl3(x + "w2", m.d, m.inter, 2 + static_cast<int>((e + 1) % 4),
             codebook, shared ? out_gain : 1.0f);
        Exl3(x + "w3", m.inter, m.d, 2 + static_cast<int>((e + 2) % 4),
             codebook, boost);
      }
      return;
    }
    for (int64_t e = 0; e < experts; ++e) {
      // Every eighth expert (e = 3 mod 8) has 4x larger w1 / w3.
      const int boost = e % 8 == 3 ? 2 : 0;
      const std::string x = absl::StrCat(f, "experts.", e, ".");
      Fp4(x + "w1", m.inter, m.d, up + boost);
      Fp4(x + "w2", m.d, m.inter,
          down - (main && m.aligned ? kAlignedExpertStep : 0));
      Fp4(x + "w3", m.inter, m.d, up + boost);
    }
    Fp8(f + "shared_experts.w1", m.inter, m.d);
    Fp8(f + "shared_experts.w2", m.d, m.inter, out_gain);
    Fp8(f + "shared_experts.w3", m.inter, m.d);
  }

  void Build(const std::vector<int64_t>& engram_rows) {
    const Dims& m = m_;
    const float inv_d = 1.0f / std::sqrt(static_cast<float>(m.d));
    NewShard();
    if (m.aligned) {
      // Only the Markov rank's columns, with a gain: the stream stays
      // close to the token's embedding through the (quiet) layers.
      Bf16("embed.weight", {m.vocab, m.d}, kAlignedEmbedGain);
      tensors().back().keep_cols = m.markov_rank;
    } else {
      Bf16("embed.weight", {m.vocab, m.d}, 1.0f);
    }
    const auto embed = std::make_shared<const TensorPlan>(tensors().back());
    for (int layer = 0; layer < m.layers; ++layer) {
      NewShard();
      Block(absl::StrCat("layers.", layer, "."), layer);
    }
    NewShard();
    // Logits = head . (unit-rms x): std 2.
    Bf16("head.weight", {m.vocab, m.d}, 2.0f * inv_d);
    const auto head = std::make_shared<const TensorPlan>(tensors().back());
    Norm("norm.weight", m.d);
    const auto norm = std::make_shared<const TensorPlan>(tensors().back());
    if (m.arch == ReleaseArch::kV41Flash) {
      for (const char* n : {"image_start", "image_end", "image_newline"}) {
        Bf16(n, {m.d}, 1.0f);
      }
      VisionTower();
    } else {
      HcHead("");
    }
    for (int s = 0; s < m.stages; ++s) {
      NewShard();
      const std::string p = absl::StrCat("mtp.", s, ".");
      Block(p, m.layers + s);
      if (!IsDspark(m)) {  // V4-Flash MTP block
        Fp8(p + "e_proj", m.d, m.d);
        Fp8(p + "h_proj", m.d, m.d);
        Norm(p + "enorm.weight", m.d);
        Norm(p + "hnorm.weight", m.d);
        Norm(p + "norm.weight", m.d);
        HcHead(p);
        continue;
      }
      if (s == 0) {
        Fp8(p + "main_proj", m.d, m.d * static_cast<int64_t>(m.targets.size()));
        Norm(p + "main_norm.weight", m.d);
      }
      if (s == m.stages - 1) {
        const int64_t r = m.markov_rank;
        const bool v41 = m.arch == ReleaseArch::kV41Flash;
        const std::string w1 = p + (v41 ? "markov_head.embed.weight"
                                        : "markov_head.markov_w1.weight");
        const std::string w2 = p + (v41 ? "markov_head.head.weight"
                                        : "markov_head.markov_w2.weight");
        if (m.aligned) {
          // The drafter's own logits vanish (norm ~ 0) and its Markov bias
          // is the target's bigram: head . (norm * embed) over the rank's
          // columns, which is what the quiet target computes.
          Bf16(p + "norm.weight", {m.d}, 0.01f);
          Add({w1, DType::kBf16, {m.vocab, r}}, Init::kCopy, 0, 0);
          tensors().back().source = embed;
          tensors().back().scale = norm;
          Add({w2, DType::kBf16, {m.vocab, r}}, Init::kCopy, 0, 0);
          tensors().back().source = head;
        } else {
          Norm(p + "norm.weight", m.d);
          Bf16(w1, {m.vocab, r}, 1.0f);
          Bf16(w2, {m.vocab, r}, 0.5f / std::sqrt(static_cast<float>(r)));
        }
        Bf16(p + "confidence_head.proj.weight", {1, m.d + r},
             1.0f / std::sqrt(static_cast<float>(m.d + r)));
        if (!v41) HcHead(p);
      }
    }
    for (size_t t = 0; t < m.engram_layers.size(); ++t) {
      NewShard();
      ShardPlan& shard = shards_.back();
      shard.engram_layer = m.engram_layers[t];
      shard.engram_index = static_cast<int>(t);
      shard.engram_rows = engram_rows[t];
      const std::string p =
          absl::StrCat("layers.", m.engram_layers[t], ".engram.");
      const int64_t rows = engram_rows[t];
      const int64_t out = (m.hc + 1) * m.d;
      const int64_t in =
          int64_t{synthetic_internal::kColumns} * formats::kRowDim;
      // As MakeSyntheticCheckpoint declares them.
      const bool nvfp4 = engram_format_ == formats::RowFormat::kNvfp4;
      Add({p + "embed.weight",
           nvfp4 ? DType::kU8 : DType::kF8E4M3,
           {rows,
            static_cast<int64_t>(formats::RowWeightBytes(engram_format_))}},
          Init::kEngram, 0, 0);
      Add({p + "embed.scale",
           nvfp4 ? DType::kF8E4M3 : DType::kF8E8M0,
           {rows,
            static_cast<int64_t>(formats::RowScaleBytes(engram_format_))}},
          Init::kEngram, 0, 0);
      Add({p + "wkv.weight", DType::kF8E4M3, {out, in}}, Init::kEngram, 0, 0);
      Add({p + "wkv.scale", DType::kF8E8M0, {(out + 31) / 32, (in + 31) / 32}},
          Init::kEngram, 0, 0);
      Add({p + "q_weight", DType::kBf16, {m.hc, m.d}}, Init::kEngram, 0, 0);
      Add({p + "k_weight", DType::kBf16, {m.hc, m.d}}, Init::kEngram, 0, 0);
    }
  }

  // The ViT (vision.*) and the aligner: BF16 linears with biases and BF16
  // norms, as the vision code of the V4.1 release builds them.
  void VisionTower() {
    const Dims& m = m_;
    const int64_t vd = m.vision_dim;
    const auto linear = [&](const std::string& p, int64_t out, int64_t in,
                            bool bias) {
      Bf16(p + ".weight", {out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
      if (bias) Bf16(p + ".bias", {out}, 0.02f);
    };
    linear("vision.patch_embed.proj", vd, 3 * m.vision_patch * m.vision_patch,
           true);
    for (int b = 0; b < m.vision_layers; ++b) {
      const std::string p = absl::StrCat("vision.blocks.", b, ".");
      Norm(p + "norm1.weight", vd);
      linear(p + "attn.wqkv", 3 * vd, vd, true);
      linear(p + "attn.wo", vd, vd, true);
      Norm(p + "norm2.weight", vd);
      linear(p + "mlp.w1", 2 * m.vision_inter, vd, false);
      linear(p + "mlp.w2", vd, m.vision_inter, false);
    }
    Norm("vision.norm.weight", vd);
    linear("aligner.w1", m.d, vd * m.vision_downsample * m.vision_downsample,
           true);
    linear("aligner.w2", m.d, m.d, true);
  }

 private:
  const Dims& m_;
  const formats::RowFormat engram_format_;
  std::vector<ShardPlan> shards_;
  // "layers.L.ffn." of the layers with GridBook experts.
  std::vector<std::string> gridbook_layers_;
};

// --- Values ---

// A seed per tensor name (FNV-1a mixed with the seed).
uint64_t TensorSeed(uint64_t seed, const std::string& name) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (const char c : name) {
    hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001B3ULL;
  }
  return SplitMix(seed ^ hash).Next();
}

// Approximately N(0, 1) from four uniforms (no transcendental functions).
float Normal(SplitMix& mix) {
  const float sum =
      mix.Uniform() + mix.Uniform() + mix.Uniform() + mix.Uniform();
  return (sum - 2.0f) * 1.7320508f;
}

int64_t Count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> Normals(uint64_t seed, const TensorPlan& t) {
  SplitMix mix(TensorSeed(seed, t.decl.name));
  std::vector<float> v(Count(t.decl.shape));
  for (float& x : v) x = t.mean + t.stddev * Normal(mix);
  if (t.keep_cols > 0) {
    const int64_t cols = t.decl.shape.back();
    for (size_t i = 0; i < v.size(); ++i) {
      if (static_cast<int64_t>(i) % cols >= t.keep_cols) v[i] = 0.0f;
    }
  }
  return v;
}

// A value as a BF16 tensor stores it.
float Bf16Rounded(float x) {
  return formats::Bf16ToFloat(formats::FloatToBf16(x));
}

// kCopy: columns [0, cols) of the source's stored values, times the scale
// tensor's stored value of the column.
std::vector<float> Copied(uint64_t seed, const TensorPlan& t) {
  const std::vector<float> src = Normals(seed, *t.source);
  std::vector<float> scale;
  if (t.scale != nullptr) scale = Normals(seed, *t.scale);
  const int64_t rows = t.decl.shape[0], cols = t.decl.shape[1];
  const int64_t src_cols = t.source->decl.shape[1];
  std::vector<float> v(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float x = Bf16Rounded(src[r * src_cols + c]);
      if (!scale.empty()) x *= Bf16Rounded(scale[c]);
      v[r * cols + c] = x;
    }
  }
  return v;
}

std::vector<uint8_t> Bytes(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out;
  if (dtype == DType::kF32) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    out.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t b = formats::FloatToBf16(v[i]);
      out[2 * i] = static_cast<uint8_t>(b & 0xFF);
      out[2 * i + 1] = static_cast<uint8_t>(b >> 8);
    }
  }
  return out;
}

// e4m3 codes of `values` [rows, cols] with one UE8M0 scale per `block` x
// `block` square (2^k, the smallest with amax / 2^k <= 448).
void EncodeFp8(const std::vector<float>& values, int64_t rows, int64_t cols,
               int64_t block, std::vector<uint8_t>& codes,
               std::vector<uint8_t>& scales) {
  const int64_t br = (rows + block - 1) / block;
  const int64_t bc = (cols + block - 1) / block;
  codes.assign(values.size(), 0);
  scales.assign(br * bc, 127);
  for (int64_t i = 0; i < br; ++i) {
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t r1 = std::min(rows, (i + 1) * block);
      const int64_t c1 = std::min(cols, (j + 1) * block);
      float amax = 0.0f;
      for (int64_t r = i * block; r < r1; ++r) {
        for (int64_t c = j * block; c < c1; ++c) {
          amax = std::max(amax, std::fabs(values[r * cols + c]));
        }
      }
      int k = 0;
      if (amax > 0.0f) {
        int e = 0;
        const double frac = std::frexp(static_cast<double>(amax) / 448.0, &e);
        k = frac == 0.5 ? e - 1 : e;
        k = std::clamp(k, -127, 127);
      }
      scales[i * bc + j] = static_cast<uint8_t>(127 + k);
      for (int64_t r = i * block; r < r1; ++r) {
        for (int64_t c = j * block; c < c1; ++c) {
          codes[r * cols + c] =
              formats::FloatToE4m3(std::ldexp(values[r * cols + c], -k));
        }
      }
    }
  }
}

// Writes the tensors of one tiny shard (all but Engram ones).
absl::Status AppendValues(const Dims& m, uint64_t seed,
                          const std::vector<TensorPlan>& tensors,
                          checkpoint::SafetensorsWriter& writer) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorPlan& t = tensors[i];
    const std::string& name = t.decl.name;
    switch (t.init) {
      case Init::kNorm:
      case Init::kNormal:
        RETURN_IF_ERROR(
            writer.Append(name, Bytes(Normals(seed, t), t.decl.dtype)));
        break;
      case Init::kHcBase: {
        std::vector<float> v = Normals(seed, t);
        const int64_t hc = m.hc;
        const float pre = -static_cast<float>(std::log(hc - 1.0));
        for (int64_t j = 0; j < hc; ++j) v[j] += pre;
        for (int64_t j = 0; j < hc; ++j) v[2 * hc + j * hc + j] += 2.0f;
        RETURN_IF_ERROR(writer.Append(name, Bytes(v, DType::kF32)));
        break;
      }
      case Init::kHeadBase: {
        std::vector<float> v = Normals(seed, t);
        for (float& x : v) x += -static_cast<float>(std::log(m.hc - 1.0));
        RETURN_IF_ERROR(writer.Append(name, Bytes(v, DType::kF32)));
        break;
      }
      case Init::kFp8: {
        // The weight entry; its scale follows.
        const int64_t rows = t.decl.shape[0];
        const int64_t cols = t.decl.shape[1];
        std::vector<uint8_t> codes;
        std::vector<uint8_t> scales;
        EncodeFp8(Normals(seed, t), rows, cols, m.block, codes, scales);
        RETURN_IF_ERROR(writer.Append(name, codes));
        RETURN_IF_ERROR(writer.Append(tensors[++i].decl.name, scales));
        break;
      }
      case Init::kFp4: {
        SplitMix mix(TensorSeed(seed, name));
        std::vector<uint8_t> packed(Count(t.decl.shape));
        for (uint8_t& b : packed) b = static_cast<uint8_t>(mix.Next() & 0xFF);
        const TensorPlan& s = tensors[++i];
        std::vector<uint8_t> scales(Count(s.decl.shape));
        for (uint8_t& x : scales) {
          x = static_cast<uint8_t>(std::clamp(
              t.exponent + static_cast<int>(mix.Next() % 5) - 2, 1, 254));
        }
        RETURN_IF_ERROR(writer.Append(name, packed));
        RETURN_IF_ERROR(writer.Append(s.decl.name, scales));
        break;
      }
      case Init::kTid2eid: {
        SplitMix mix(TensorSeed(seed, name));
        const int64_t rows = t.decl.shape[0];
        const int64_t k = t.decl.shape[1];
        std::vector<int64_t> ids(t.experts);
        std::vector<uint8_t> bytes(rows * k * 8);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t e = 0; e < t.experts; ++e) ids[e] = e;
          for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates
            const int64_t pick =
                j + static_cast<int64_t>(mix.Next() % (t.experts - j));
            std::swap(ids[j], ids[pick]);
            std::memcpy(&bytes[(r * k + j) * 8], &ids[j], 8);
          }
        }
        RETURN_IF_ERROR(writer.Append(name, bytes));
        break;
      }
      case Init::kCopy:
        RETURN_IF_ERROR(
            writer.Append(name, Bytes(Copied(seed, t), t.decl.dtype)));
        break;
      case Init::kBits: {
        SplitMix mix(TensorSeed(seed, name));
        std::vector<uint8_t> bytes(Count(t.decl.shape) *
                                   checkpoint::DTypeSize(t.decl.dtype));
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(mix.Next() & 0xFF);
        RETURN_IF_ERROR(writer.Append(name, bytes));
        break;
      }
      case Init::kSigned: {
        SplitMix mix(TensorSeed(seed, name));
        std::vector<uint8_t> bytes;
        for (int64_t j = 0; j < Count(t.decl.shape); ++j) {
          const uint64_t r = mix.Next();
          const float magnitude =
              t.stddev * (0.75f + 0.5f * static_cast<float>(r >> 40) /
                                      static_cast<float>(1 << 24));
          const uint16_t half =
              formats::FloatToFp16((r & 1) != 0 ? -magnitude : magnitude);
          bytes.push_back(static_cast<uint8_t>(half & 0xFF));
          bytes.push_back(static_cast<uint8_t>(half >> 8));
        }
        RETURN_IF_ERROR(writer.Append(name, bytes));
        break;
      }
      case Init::kCodewords: {
        SplitMix mix(TensorSeed(seed, name));
        std::vector<uint8_t> bytes(Count(t.decl.shape));
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(mix.Next() & 0xFF);
        if (t.two_tier) {
          // Each superblock's plane: the exponent byte, then 8 random
          // nibble bytes (all 16 table entries are legal with it).
          const int64_t index_bytes = 4 * int64_t{t.codeword_bits};
          const int64_t type_size = index_bytes + 9;
          for (int64_t b = 0;
               b + type_size <= static_cast<int64_t>(bytes.size());
               b += type_size) {
            bytes[b + index_bytes] =
                static_cast<uint8_t>(t.exponent + (mix.Next() & 1));
          }
        }
        RETURN_IF_ERROR(writer.Append(name, bytes));
        break;
      }
      case Init::kMarker: {
        const auto value = static_cast<int32_t>(t.experts);
        std::vector<uint8_t> bytes(4);
        std::memcpy(bytes.data(), &value, 4);
        RETURN_IF_ERROR(writer.Append(name, bytes));
        break;
      }
      case Init::kEngram:
        return absl::InternalError("Engram tensor outside an Engram shard");
    }
  }
  return absl::OkStatus();
}

// A shard of the release's header followed by a hole for its data.
absl::Status WriteSparseShard(const std::string& path,
                              std::vector<checkpoint::TensorDecl> decls,
                              uint64_t& data_bytes) {
  ASSIGN_OR_RETURN(checkpoint::EncodedSafetensorsHeader header,
                   checkpoint::EncodeSafetensorsHeader(
                       std::move(decls), {{"format", "pt"}},
                       absl::StrCat("sparse shard '", path, "'")));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  const std::string& prefix = header.prefix;
  size_t done = 0;
  while (done < prefix.size()) {
    const ssize_t n = ::write(fd, prefix.data() + done, prefix.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  const off_t size = static_cast<off_t>(prefix.size() + header.data_bytes);
  if (::ftruncate(fd, size) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(
        "cannot extend ", path, " to ", size, " bytes: ", std::strerror(err)));
  }
  if (::close(fd) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot close ", path, ": ", std::strerror(errno)));
  }
  data_bytes = header.data_bytes;
  return absl::OkStatus();
}

std::string ShardName(int index, int count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

}  // namespace

absl::StatusOr<ReleaseArch> ParseReleaseArch(absl::string_view name) {
  for (ReleaseArch a : {ReleaseArch::kV4Flash, ReleaseArch::kV41Flash,
                        ReleaseArch::kV4Flash0731}) {
    if (name == ReleaseArchName(a)) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--arch=", name, ": must be one of v4-flash, v4.1-flash, v4-flash-0731"));
}

std::string ReleaseArchName(ReleaseArch arch) {
  switch (arch) {
    case ReleaseArch::kV4Flash:
      return "v4-flash";
    case ReleaseArch::kV41Flash:
      return "v4.1-flash";
    case ReleaseArch::kV4Flash0731:
      return "v4-flash-0731";
  }
  return "unknown";
}

// The GridBook artifact files of a tiny model with GridBook experts:
// cb_codebooks.pqcb (the NVFP4_CB_K16 tables: random E2M1 values; the
// FP8_CB_K36 tables: e4m3 of N(0, 1)), quant_config.json (the routed and
// shared experts' config groups, the attention projections as FP8 source
// passthrough units in the Transformers spelling, the draft stages' MXFP4
// experts as passthrough, the W4A4 contract and the codebook digests), and
// the pointer stub for config.json's quantization_config.
absl::StatusOr<nlohmann::ordered_json> WriteGridbookArtifact(
    const std::string& dir, const Dims& m,
    const std::vector<std::string>& layers, uint64_t seed) {
  namespace gb = formats::gridbook;
  struct Book {
    std::string name;
    std::vector<uint16_t> values;  // fp16 bits
    int64_t rows;
    int64_t cols;
  };
  std::vector<Book> books;
  SplitMix mix(TensorSeed(seed, "cb_codebooks.pqcb"));
  ASSIGN_OR_RETURN(
      const gb::Scheme fp4,
      gb::SchemeForFormat("NVFP4_CB_K16", gb::ScaleCoding::kTwoTier));
  ASSIGN_OR_RETURN(const gb::Scheme fp8,
                   gb::SchemeForFormat("FP8_CB_K36", gb::ScaleCoding::kNone));
  std::vector<std::string> fp4_refs;
  std::vector<std::string> fp8_refs;
  for (int sub = 0; sub < fp4.n_sub; ++sub) {
    Book b{absl::StrCat("cb_codebook.experts.NVFP4_CB_K16.sub", sub),
           {},
           gb::SubTableRows(fp4, sub),
           gb::SubTableColumns(fp4)};
    for (int64_t i = 0; i < b.rows * b.cols; ++i) {
      b.values.push_back(formats::FloatToFp16(
          formats::E2m1ToFloat(static_cast<uint8_t>(mix.Next() & 0xF))));
    }
    fp4_refs.push_back(b.name);
    books.push_back(std::move(b));
  }
  for (int sub = 0; sub < fp8.n_sub; ++sub) {
    Book b{absl::StrCat("cb_codebook.shared.FP8_CB_K36.sub", sub),
           {},
           gb::SubTableRows(fp8, sub),
           gb::SubTableColumns(fp8)};
    for (int64_t i = 0; i < b.rows * b.cols; ++i) {
      // Box-Muller from two uniforms, then the nearest e4m3 value.
      const double u1 = (static_cast<double>(mix.Next() >> 11) + 1.0) * 0x1p-53;
      const double u2 = static_cast<double>(mix.Next() >> 11) * 0x1p-53;
      const double normal =
          std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      b.values.push_back(formats::FloatToFp16(formats::E4m3ToFloat(
          formats::FloatToE4m3(static_cast<float>(normal)))));
    }
    fp8_refs.push_back(b.name);
    books.push_back(std::move(b));
  }
  std::vector<checkpoint::TensorDecl> decls;
  decls.reserve(books.size());
  for (const Book& b : books) {
    decls.push_back({b.name, DType::kF16, {b.rows, b.cols}});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::SafetensorsWriter> writer,
                   checkpoint::SafetensorsWriter::Create(
                       dir + "/cb_codebooks.pqcb", std::move(decls),
                       {.metadata = {{"format", "pt"}}}));
  nlohmann::ordered_json digests = nlohmann::ordered_json::object();
  for (const Book& b : books) {
    std::vector<uint8_t> bytes(b.values.size() * 2);
    std::memcpy(bytes.data(), b.values.data(), bytes.size());
    digests[b.name] = Sha256Hex(bytes);
    RETURN_IF_ERROR(writer->Append(b.name, bytes));
  }
  RETURN_IF_ERROR(writer->Finish());

  nlohmann::ordered_json routed = nlohmann::ordered_json::array();
  nlohmann::ordered_json shared = nlohmann::ordered_json::array();
  nlohmann::ordered_json units = nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, float>> contract;
  for (const std::string& f : layers) {  // "layers.L.ffn."
    for (const char* proj : {"experts.gate_up_proj", "experts.down_proj"}) {
      routed.push_back(f + proj);
      contract.emplace_back(f + proj, kGridbookInputScale);
    }
    // The shared experts in the Transformers spelling (mapped back by
    // loaders), the attention projections as passthrough units.
    const std::string layer = f.substr(0, f.size() - 5);  // "layers.L"
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      shared.push_back(
          absl::StrCat("model.", layer, ".mlp.shared_experts.", proj));
    }
    for (const char* proj : {"wq_a", "wq_b", "wkv", "wo_a", "wo_b"}) {
      units[absl::StrCat("model.", layer, ".self_attn.", proj)] =
          "fp8_e4m3_ue8m0_block128";
    }
  }
  for (int s = 0; s < m.stages; ++s) {
    units[absl::StrCat("mtp.", s, ".ffn.experts")] = "mxfp4_e2m1_ue8m0_g32";
  }
  std::vector<std::string> target_names;
  target_names.reserve(contract.size());
  for (const auto& [name, value] : contract) target_names.push_back(name);
  std::sort(target_names.begin(), target_names.end());
  const char* policy = "full_e4m3_range_448x6_over_calibration_amax.v1";
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  for (const float t : fp4.two_tier_table) table.push_back(t);
  const nlohmann::ordered_json quant = {
      {"quant_method", "gridbook"},
      {"format", "nvfp4_cb"},
      {"codebook_file", "cb_codebooks.pqcb"},
      {"layout_version", 2},
      {"config_groups",
       {{"group_routed_experts",
         {{"format", "NVFP4_CB_K16"},
          {"targets", routed},
          {"scheme",
           {{"grid", "fp4"},
            {"mode", "product"},
            {"k", fp4.k},
            {"n_sub", fp4.n_sub},
            {"type_size", gb::TypeSize(fp4)},
            {"group_size", 16},
            {"vec_dim", 8},
            {"superblock", gb::kSuperblock},
            {"act_bits", 4},
            {"scale_coding",
             {{"kind", "two_tier"},
              {"sub_bits", 4},
              {"super_bias", 127},
              {"table", table}}},
            {"activation_contract", "nvfp4_w4a4"},
            {"codebook_source", "lattice"},
            {"codebook_group", "experts"},
            {"codebook_ref", fp4_refs}}}}},
        {"group_shared_experts",
         {{"format", "FP8_CB_K36"},
          {"targets", shared},
          {"scheme",
           {{"grid", "fp8"},
            {"mode", "product"},
            {"k", fp8.k},
            {"n_sub", fp8.n_sub},
            {"type_size", gb::TypeSize(fp8)},
            {"group_size", 0},
            {"vec_dim", 8},
            {"superblock", gb::kSuperblock},
            {"act_bits", 8},
            {"codebook_source", "lattice"},
            {"codebook_group", "shared"},
            {"codebook_ref", fp8_refs}}}}},
        {"group_source",
         {{"format", "source-passthrough"},
          {"source_format", "FP8_BLOCK_UE8M0_SOURCE"},
          {"weights", {{"source_passthrough", true}}}}}}},
      {"ignore", {"embed", "head", "re:.*norm.*", "re:.*ffn\\.gate\\..*"}},
      {"source_passthrough", {{"version", 1}, {"units", units}}},
      {"execution_contracts",
       {{"nvfp4_w4a4",
         {{"schema", "prismaquant.nvfp4_w4a4_activation.v1"},
          {"contract", "e2m1_group16_ue4m3_static"},
          {"group_size", 16},
          {"tensor_suffix", "input_global_scale"},
          {"value_dtype", "float32"},
          {"input_global_scale_policy", policy},
          {"target_count", target_names.size()},
          {"target_names", target_names},
          {"target_values_sha256",
           checkpoint::GridbookContractDigest(policy, contract)}}}}},
      {"provenance",
       {{"codebook_sha256", digests}, {"codebook_source", "lattice"}}}};
  RETURN_IF_ERROR(mneme::WriteFileAtomically(dir + "/quant_config.json",
                                             quant.dump(2) + "\n"));
  return nlohmann::ordered_json{{"quant_method", "gridbook"},
                                {"format", "nvfp4_cb"},
                                {"config_file", "quant_config.json"},
                                {"codebook_file", "cb_codebooks.pqcb"}};
}

absl::StatusOr<ExpertsFormat> ParseExpertsFormat(absl::string_view name) {
  if (name == "mxfp4") return ExpertsFormat::kMxfp4;
  if (name == "exl3") return ExpertsFormat::kExl3;
  if (name == "gridbook") return ExpertsFormat::kGridbook;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown experts format \"", name, "\" (mxfp4, exl3 or gridbook)"));
}

absl::Status MakeReleaseCheckpoint(const ReleaseCheckpointOptions& o) {
  if (o.out_dir.empty())
    return absl::InvalidArgumentError("out_dir is required");
  if (o.arch != ReleaseArch::kV4Flash && o.arch != ReleaseArch::kV41Flash &&
      o.arch != ReleaseArch::kV4Flash0731) {
    return absl::InvalidArgumentError("arch is not a known release");
  }
  if (o.engram_vocab_size < 100 || o.engram_vocab_size >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_vocab_size=", o.engram_vocab_size, " must be in [100, 2^31)"));
  }
  if (o.threads < 0 || o.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads=", o.threads, " must be in [0, 1024]"));
  }
  std::error_code ec;
  if (fs::exists(o.out_dir, ec) &&
      (!fs::is_directory(o.out_dir, ec) || !fs::is_empty(o.out_dir, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--out=", o.out_dir, " exists and is not an empty directory"));
  }
  const std::string partial = o.out_dir + ".partial";
  fs::remove_all(partial, ec);
  if (!fs::create_directories(partial, ec)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", partial, ": ", ec.message()));
  }

  // Tokenizer files as MakeSyntheticCheckpoint writes them.
  const std::string tokenizer_path = partial + "/tokenizer.json";
  RETURN_IF_ERROR(
      mneme::WriteFileAtomically(tokenizer_path, SyntheticTokenizerJson()));
  RETURN_IF_ERROR(mneme::WriteFileAtomically(
      partial + "/tokenizer_config.json",
      nlohmann::ordered_json{{"add_bos_token", true},
                             {"add_eos_token", false},
                             {"bos_token", "<｜begin▁of▁sentence｜>"},
                             {"eos_token", "<｜end▁of▁sentence｜>"},
                             {"pad_token", "<｜▁pad▁｜>"},
                             {"clean_up_tokenization_spaces", false},
                             {"model_max_length", 131072},
                             {"tokenizer_class", "LlamaTokenizerFast"}}
              .dump(2) +
          "\n"));

  if (o.aligned_draft && (o.arch != ReleaseArch::kV41Flash || o.full_shapes)) {
    return absl::InvalidArgumentError(
        "aligned_draft applies to the tiny V4.1-Flash model only");
  }
  if (o.experts_format != ExpertsFormat::kMxfp4 && o.full_shapes) {
    return absl::InvalidArgumentError(
        "experts_format applies to the tiny models only");
  }
  Dims m = MakeDims(o.arch, o.full_shapes);
  m.aligned = o.aligned_draft;
  m.experts_format = o.experts_format;
  if (o.experts_format == ExpertsFormat::kGridbook) {
    m.inter = kGridbookIntermediate;
  }
  // Engram rows and the compressed vocabulary (V4.1).
  std::vector<int64_t> engram_rows = m.engram_rows;
  int64_t engram_vocab = m.engram_vocab;
  int64_t compressed = m.engram_compressed;
  if (o.arch == ReleaseArch::kV41Flash && !o.full_shapes) {
    ASSIGN_OR_RETURN(std::unique_ptr<engram::CompressedVocabulary> vocab,
                     engram::CompressedVocabulary::Create(
                         {.tokenizer_json_path = tokenizer_path}));
    compressed = vocab->size();
    engram_vocab = o.engram_vocab_size;
    ASSIGN_OR_RETURN(
        std::vector<std::vector<int64_t>> primes,
        engram::SearchColumnPrimes(
            o.engram_vocab_size, static_cast<int>(m.engram_layers.size()),
            synthetic_internal::kMaxNgramSize, synthetic_internal::kHeads));
    engram_rows.clear();
    for (const std::vector<int64_t>& column : primes) {
      int64_t rows = 0;
      for (int64_t p : column) rows += p;
      engram_rows.push_back(rows);
    }
  }

  if (o.engram_format == formats::RowFormat::kNvfp4 &&
      (o.arch != ReleaseArch::kV41Flash || o.full_shapes)) {
    return absl::InvalidArgumentError(
        "NVFP4 Engram tables are written for the tiny v4.1-flash model only");
  }
  Planner planner(m, o.engram_format);
  planner.Build(engram_rows);
  const std::vector<ShardPlan>& shards = planner.shards();
  const int num_shards = static_cast<int>(shards.size());

  // The Engram writer's options: the existing maker's tables for this seed.
  SyntheticCheckpointOptions engram_options;
  engram_options.seed = o.seed;
  engram_options.threads = o.threads;
  engram_options.engram_vocab_size = o.engram_vocab_size;
  engram_options.engram_layer_ids = m.engram_layers;
  engram_options.hidden_size = static_cast<int>(m.d);
  engram_options.hc_mult = m.hc;
  engram_options.engram_format = o.engram_format;
  const bool nvfp4 = o.engram_format == formats::RowFormat::kNvfp4;
  nlohmann::ordered_json global_scales = nlohmann::ordered_json::object();

  checkpoint::CheckpointIndex index;
  uint64_t total_size = 0;
  for (int s = 0; s < num_shards; ++s) {
    const ShardPlan& shard = shards[s];
    const std::string name = ShardName(s, num_shards);
    std::vector<checkpoint::TensorDecl> decls;
    for (const TensorPlan& t : shard.tensors) {
      decls.push_back(t.decl);
      index.weight_map[t.decl.name] = name;
    }
    const std::string path = absl::StrCat(partial, "/", name);
    if (o.full_shapes) {
      uint64_t bytes = 0;
      RETURN_IF_ERROR(WriteSparseShard(path, std::move(decls), bytes));
      total_size += bytes;
      continue;
    }
    ASSIGN_OR_RETURN(
        std::unique_ptr<checkpoint::SafetensorsWriter> writer,
        checkpoint::SafetensorsWriter::Create(
            path, std::move(decls), {.metadata = {{"format", "pt"}}}));
    if (shard.engram_layer >= 0) {
      const int layer = shard.engram_layer;
      const int64_t out = (m.hc + 1) * m.d;
      // The NVFP4 tables' global scale from the FP8 table's amax, as
      // MakeSyntheticCheckpoint does.
      const float global_scale =
          nvfp4
              ? formats::Nvfp4GlobalScale(SyntheticTableAmax(layer < 2 ? 0 : 1))
              : 1.0f;
      if (nvfp4) global_scales[std::to_string(layer)] = global_scale;
      RETURN_IF_ERROR(synthetic_internal::WriteTable(
          engram_options, layer, shard.engram_index, shard.engram_rows,
          global_scale, *writer));
      RETURN_IF_ERROR(
          synthetic_internal::WriteWkv(engram_options, layer, out, *writer));
      for (const char* n : {"q_weight", "k_weight"}) {
        RETURN_IF_ERROR(synthetic_internal::WriteBf16(
            absl::StrCat("layers.", layer, ".engram.", n), m.hc * m.d,
            synthetic_internal::RowSeed(o.seed, layer, n[0] == 'q' ? -2 : -3),
            *writer));
      }
    } else {
      RETURN_IF_ERROR(AppendValues(m, o.seed, shard.tensors, *writer));
    }
    total_size += writer->data_bytes();
    RETURN_IF_ERROR(writer->Finish());
  }
  index.total_size = total_size;
  RETURN_IF_ERROR(checkpoint::WriteCheckpointIndex(
      partial + "/" + std::string(checkpoint::kIndexFileName), index));

  nlohmann::ordered_json config;
  if (o.arch == ReleaseArch::kV41Flash) {
    config = V41Config(m, engram_rows, engram_vocab, compressed);
    if (nvfp4) {
      nlohmann::ordered_json& t = config["text_config"];
      t["engram_quant"] = "nvfp4";
      t["engram_quant_block_size"] = formats::kNvfp4BlockSize;
      t["engram_quant_method"] = "rtn-amax";
      t["engram_quant_global_scale"] = global_scales;
    }
  } else {
    config = nlohmann::ordered_json::parse(V4Config(m).dump());
  }
  if (o.experts_format == ExpertsFormat::kGridbook) {
    ASSIGN_OR_RETURN(
        config["quantization_config"],
        WriteGridbookArtifact(partial, m, planner.gridbook_layers(), o.seed));
  }
  if (o.experts_format == ExpertsFormat::kExl3) {
    // exllamav3's conversion config, the release's kept beside it.
    nlohmann::ordered_json original = config["quantization_config"];
    config["quantization_config"] = {
        {"quant_method", "exl3"},
        {"version", "1.4.1"},
        {"bits", 3.5},
        {"head_bits", 8},
        {"codebook", "mcg"},
        {"original_quantization_config", original}};
  }
  config["mneme_synthetic"] = {{"seed", o.seed},
                               {"arch", ReleaseArchName(o.arch)},
                               {"full_shapes", o.full_shapes}};
  RETURN_IF_ERROR(mneme::WriteFileAtomically(partial + "/config.json",
                                             config.dump(2) + "\n"));
  if (fs::exists(o.out_dir, ec)) fs::remove(o.out_dir, ec);  // Empty dir.
  fs::rename(partial, o.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", partial, " to ",
                                            o.out_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace mneme::synthetic
