#ifndef MNEME_MODEL_MODEL_CONFIG_H_
#define MNEME_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model_config.h"

namespace mneme::model {

// The released architecture a checkpoint holds (config.json model_type).
enum class Arch {
  // DeepSeek-V4-Flash and V4-Flash-0731 (model_type "deepseek_v4"):
  // per-sublayer hyper-connection mixing, hc_head, ratio-4 overlapping
  // compressors with their own indexer, ratio-128 compressors, per-head
  // query re-normalisation, hash routing on the first layers.
  kV4 = 0,
  // DeepSeek-V4.1-Flash (model_type "deepseek_v41"): one shared compressed
  // cache written by the kv source layers, a two-level indexer, staggered
  // single-pass hyper-connections, no hc_head, Engram layers.
  kV41 = 1,
};

// "deepseek_v4" / "deepseek_v41".
const char* ArchName(Arch arch);

// YaRN frequency interpolation (rope_scaling), applied on the layers with
// compressed attention only.
struct YarnParams {
  // original_max_position_embeddings; 0 = no YaRN.
  int64_t original_seq_len = 0;
  float factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
};

// The model's shape as config.json gives it (docs/MODEL_LAYOUT.md lists the
// keys, in the Hugging Face spelling or the official inference code's).
// Plain values; see LoadModelDims.
struct ModelDims {
  Arch arch = Arch::kV4;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  int hc_mult = 1;
  int hc_sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float rms_norm_eps = 1e-6f;
  int num_heads = 0;
  int head_dim = 0;
  int rope_dim = 0;
  // RoPE base of window-only layers (no YaRN) and of compressed layers
  // (with `yarn`).
  float rope_theta = 10000.0f;
  float compress_rope_theta = 10000.0f;
  YarnParams yarn;
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int o_groups = 0;
  int sliding_window = 0;
  // One per main layer; 0 = sliding window only.
  std::vector<int> compress_ratios;
  // The draft layers' entries of compress_ratios (MTP / DSpark stages).
  std::vector<int> draft_compress_ratios;
  // Indexer (selection of compressed entries).
  int index_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  // V4: the first num_hash_layers layers route by token id (tid2eid).
  int num_hash_layers = 0;
  // V4.1: the layers that compress (and own the shared cache and the index
  // keys), the layers that run an indexer, and the two-level selection.
  std::vector<int> kv_source_layers;
  std::vector<int> index_source_layers;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  int num_experts = 0;
  int experts_per_token = 0;
  int num_shared_experts = 0;
  int64_t moe_intermediate = 0;
  float routed_scaling = 1.0f;
  // <= 0: no clamp.
  float swiglu_limit = 0.0f;
  // Draft stages (MTP blocks or DSpark stages): count and their MoE.
  int num_draft_layers = 0;
  int draft_num_experts = 0;
  int draft_experts_per_token = 0;
  // DSpark (0 = none).
  int dspark_block_size = 0;
  int dspark_markov_rank = 0;
  // The token the block's positions after the anchor carry
  // (dspark_noise_token_id, < vocab_size).
  int dspark_noise_token = 0;
  std::vector<int> dspark_target_layers;
  // FP8 weight block [rows, cols].
  int fp8_block_rows = 128;
  int fp8_block_cols = 128;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  // Layers with an Engram module, ascending.
  std::vector<int> engram_layers;

  bool IsEngramLayer(int layer) const;
  bool IsV41() const { return arch == Arch::kV41; }
  // V4: whether layer `layer` runs an indexer (compress ratio 4). V4.1:
  // whether it is an index source.
  bool HasIndexer(int layer) const;
  // V4.1: whether `layer` compresses (a kv source). V4: compress ratio > 0.
  bool HasCompressor(int layer) const;
  // Whether `layer` makes index keys for its entries (V4: its indexer's
  // compressor; V4.1: a kv source).
  bool OwnsIndexKeys(int layer) const {
    return IsV41() ? HasCompressor(layer) : HasIndexer(layer);
  }
  // V4.1: the kv source whose cache `layer` reads (the latest source at or
  // before it), -1 for a window-only layer. V4: the layer itself when its
  // compress ratio is > 0, else -1.
  int CacheSource(int layer) const;
  // RoPE inverse frequencies (rope_dim / 2 values) of `layer`: rope_theta
  // without YaRN on window-only layers, compress_rope_theta with YaRN on the
  // others.
  std::vector<double> RopeFrequencies(int layer) const;
};

// Reads and validates the model keys of `config`. InvalidArgument naming the
// key (and the file) for a missing or out-of-range value or an inconsistent
// combination (heads not a multiple of o_groups, rope dim larger than the
// head, a compress_ratios list of the wrong length, top-k > experts, ...).
absl::StatusOr<ModelDims> LoadModelDims(const checkpoint::ModelConfig& config);

// Whether the model can be split over `tp_size` ranks: tp_size must divide
// the heads, the head groups and the routed experts. InvalidArgument naming
// the quantity otherwise.
absl::Status CheckTensorParallel(const ModelDims& dims, int tp_size);

}  // namespace mneme::model

#endif  // MNEME_MODEL_MODEL_CONFIG_H_
