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
};

// Writes an Engram-only checkpoint directory (what the Engram store and the
// conversion tools read; the models of the released layouts are written by
// release_checkpoint.h): config.json (the Engram keys under text_config; the
// NVFP4 keys for NVFP4 tables), tokenizer.json and tokenizer_config.json,
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
// With expert_layer_ids or draft_stages, MXFP4 routed experts follow in
// their own shards (one per layer, one for all draft stages; block exponents
// within a few powers of two of each other, w3 one above w1) and
// text_config gains n_routed_experts, moe_intermediate_size and, for draft
// stages, num_nextn_predict_layers.
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
