#ifndef MNEME_TOOLS_SYNTHETIC_SYNTHETIC_CHECKPOINT_H_
#define MNEME_TOOLS_SYNTHETIC_SYNTHETIC_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "formats/row_format.h"

namespace mneme::synthetic {

// How the values of each Engram layer's wkv.weight are drawn.
enum class WkvKind {
  // Independent, roughly N(0, 1)-sized e4m3 codes with random UE8M0 block
  // scales.
  kIndependent = 0,
  // Realistic: within each hash column's 256 inputs the values follow an
  // AR(1) process across the inputs (correlation 0.5 between neighbours)
  // times a per-input scale spread over [0.5, 2), encoded to FP8 with each
  // 32 x 32 block's scale from its amax. Correlated input columns, as
  // trained projections have: structure GPTQ's error feedback can exploit
  // beyond what an independent W_c offers (whose W_c^T W_c is close to a
  // multiple of the identity when wkv has many more rows than 256).
  kCorrelated = 1,
};

// What the checkpoint holds besides the tokenizer and config.json.
enum class Contents {
  // The Engram layers' tensors, plus the MXFP4 routed experts of
  // expert_layer_ids and draft_stages: what the Engram store and the
  // conversion tools read. config.json holds the Engram keys (and the expert
  // keys when there are experts).
  kEngramOnly = 0,
  // A complete model of the layout of docs/MODEL_LAYOUT.md, as the worker
  // loads it: every layer has attention (with a compressor where its compress
  // ratio is > 0), hyper-connections (hc_mult > 1), a router, MXFP4 routed
  // experts and FP8 shared experts; embed / head / norm / hc_head; the
  // Engram layers as with kEngramOnly. config.json holds every key of
  // MODEL_LAYOUT.md plus quantization_config (FP8 e4m3, UE8M0 scales, 32 x 32
  // blocks) at the top level.
  kFullModel = 1,
};

struct SyntheticCheckpointOptions {
  // Directory to create. It must not exist (or be an empty directory); the
  // checkpoint is written under OUT.partial and renamed at the end, so a
  // directory named OUT is always complete. Required.
  std::string out_dir;
  // Format of the Engram tables. Default: kFp8.
  formats::RowFormat engram_format = formats::RowFormat::kFp8;
  // Seed of every generated value. Default: 0.
  uint64_t seed = 0;
  // engram_vocab_size: start of the prime search, so each table has about
  // 24 x this many rows. Default: 1000 (~24K rows, ~6 MB per FP8 table);
  // 1,000,000 gives ~6 GB FP8 tables for benchmarks. Range [100, 2^31).
  int64_t engram_vocab_size = 1000;
  // engram_layer_ids. Default: {1, 3}.
  std::vector<int> engram_layer_ids = {1, 3};
  // num_hidden_layers; must exceed every Engram layer id. Default: 4.
  int num_hidden_layers = 4;
  // hidden_size; a multiple of 32 (wkv has 32 x 32 scale blocks). Default: 64.
  int hidden_size = 64;
  // hc_mult (hyper-connection copies). Default: 4.
  int hc_mult = 4;
  // Worker threads generating rows; 0 = all cores. Default: 0.
  int threads = 0;
  // Print progress on stderr for tables of more than this many rows.
  // Default: 2,000,000.
  int64_t progress_min_rows = 2'000'000;
  // Values of wkv.weight. Default: kIndependent.
  WkvKind wkv_kind = WkvKind::kIndependent;
  // Main layers that get MXFP4 routed experts, ascending, each in
  // [0, num_hidden_layers): layers.L.ffn.experts.E.w{1,2,3}.weight (U8
  // [out, in / 2], two e2m1 codes per byte, even element in the low nibble)
  // with .scale (F8_E8M0 [out, in / 32]); w1 and w3 are [moe_intermediate,
  // hidden], w2 is [hidden, moe_intermediate]. Each such layer gets its own
  // shard after the Engram shards. Default: none.
  std::vector<int> expert_layer_ids;
  // Draft stages mtp.0 .. mtp.<n - 1> with the same MXFP4 routed experts
  // (mtp.S.ffn.experts.E.*), all in one last shard. Default: 0.
  int draft_stages = 0;
  // Routed experts per layer or stage with experts; >= 1. Default: 4.
  int num_routed_experts = 4;
  // moe_intermediate_size; a positive multiple of 32. Default: 64.
  int moe_intermediate_size = 64;
  // What to write. kFullModel requires expert_layer_ids to be empty (every
  // layer then has num_routed_experts experts of moe_intermediate_size) and
  // draft_stages to be 0. Default: kEngramOnly.
  Contents contents = Contents::kEngramOnly;

  // The model dimensions below are used with kFullModel only (and are not
  // validated otherwise). FP8 matrices may have any shape: the last block
  // row / column of their 32 x 32 scale grid is then partial.

  // num_attention_heads (H); >= 1 and a multiple of o_groups. Default: 8.
  int num_attention_heads = 8;
  // head_dim (hd) of every query head and of the single K = V head; even,
  // >= qk_rope_head_dim. Default: 64.
  int head_dim = 64;
  // qk_rope_head_dim: the last dims of a head that get RoPE; even, in
  // [2, head_dim]. Default: 16.
  int qk_rope_head_dim = 16;
  // q_lora_rank: wq_a's output; >= 1. Default: 64.
  int q_lora_rank = 64;
  // o_lora_rank: wo_a's output per head group; >= 1. Default: 64.
  int o_lora_rank = 64;
  // o_groups (G): head groups of the output projection; >= 1. Default: 4.
  int o_groups = 4;
  // sliding_window (W): keys of the window, the token itself included;
  // >= 1. Default: 16.
  int sliding_window = 16;
  // compress_ratios: one per layer (size num_hidden_layers), each >= 0;
  // 0 = window only (no compressor tensors), r > 0 = one compressed entry
  // per r tokens. Default: {0, 1, 2, 4} (matching num_hidden_layers = 4).
  std::vector<int> compress_ratios = {0, 1, 2, 4};
  // num_experts_per_tok (top-k); in [1, num_routed_experts]. Default: 2.
  int num_experts_per_tok = 2;
  // n_shared_experts; the shared expert's intermediate is n x
  // moe_intermediate_size; 0 = no shared expert tensors. >= 0. Default: 1.
  int n_shared_experts = 1;
  // routed_scaling_factor: scale of the routed sum; finite, > 0.
  // Default: 1.5.
  double routed_scaling_factor = 1.5;
  // swiglu_limit: SwiGLU clamp, 0 = none; finite, >= 0. Default: 10.
  double swiglu_limit = 10.0;
  // rope_theta: RoPE base; finite, > 0. Default: 10000.
  double rope_theta = 10000.0;
  // hc_sinkhorn_iters: Sinkhorn iterations of the comb matrix; >= 1.
  // Default: 20.
  int hc_sinkhorn_iters = 20;
};

// The tiny model of docs/MODEL_LAYOUT.md (what `mneme make-checkpoint
// --model` writes): contents kFullModel, hidden_size 256, 4 layers, Engram
// layers {1, 3}, hc_mult 4, 16 routed experts of moe_intermediate_size 64,
// top-2, and the defaults above for the rest. out_dir is left empty.
SyntheticCheckpointOptions TinyModelOptions();

// Writes a checkpoint directory of the DeepSeek-V4.1 layout at miniature
// size: config.json (model keys under text_config; the NVFP4 keys for NVFP4
// tables), tokenizer.json and tokenizer_config.json,
// model.safetensors.index.json (mapping every tensor) and the shards.
//
// Always, first: one shard per Engram layer holding its six tensors
// (embed.weight / embed.scale as the format requires, wkv.weight /
// wkv.scale in FP8 [(hc_mult + 1) x hidden, 6144] with 32 x 32 blocks,
// q_weight / k_weight in BF16). Row values are heavy-tailed and
// deterministic per (seed, layer, row); an NVFP4 table is the
// round-to-nearest quantization of the FP8 table of the same seed, with the
// global scale from its amax.
//
// kEngramOnly: with expert_layer_ids or draft_stages, MXFP4 routed experts
// follow in their own shards (one per layer, one for all draft stages; block
// exponents within a few powers of two of each other, w3 one above w1) and
// text_config gains n_routed_experts, moe_intermediate_size and, for draft
// stages, num_nextn_predict_layers. Without those options (and with
// kIndependent wkv) the output is exactly what it always was.
//
// kFullModel: then one shard per layer with all its other tensors, and a
// last shard with embed / head / norm / hc_head_*. Values are drawn so that
// activations keep a sane range through the layers: linear weights
// ~ N(0, 1) / sqrt(in) (FP8 with each 32 x 32 block's UE8M0 scale from its
// amax; MXFP4 routed experts as above with block exponents chosen for the
// same spread), norm weights 1 + 0.05 N(0, 1), embed ~ N(0, 1) and head
// ~ 3 N(0, 1) / sqrt(hidden) in BF16 (logits of a few units), hc_*_fn
// ~ 0.1 N(0, 1) / sqrt(hc_mult x hidden) with bases giving pre ~ 1 /
// hc_mult, post ~ 1 and a comb that favours the identity (~0.7 on the
// diagonal), attn_sink ~ 0.5 N(0, 1), compressor ape ~ 0.1 N(0, 1), gate
// ~ N(0, 1) / sqrt(hidden) in BF16 with a bias ~ 0.03 N(0, 1) (biased and
// unbiased top-k differ for some tokens). A model tensor's values depend
// only on the seed and its name; the same options always write
// byte-identical files.
//
// InvalidArgument naming the field for bad options; FailedPrecondition when
// out_dir exists and is not an empty directory; I/O errors otherwise.
absl::Status MakeSyntheticCheckpoint(const SyntheticCheckpointOptions& options);

// The kRowDim values row `row` of layer `layer` is generated from (before
// FP8 encoding). |value| <= SyntheticTableAmax(layer_index).
void SyntheticRowValues(uint64_t seed, int layer, int64_t row,
                        absl::Span<float> out);

// The clip bound of the values of the layer_index-th Engram layer (11.0 for
// the first, 24.0 for the others, as the published V4.1 tables' amax).
float SyntheticTableAmax(int layer_index);

}  // namespace mneme::synthetic

#endif  // MNEME_TOOLS_SYNTHETIC_SYNTHETIC_CHECKPOINT_H_
