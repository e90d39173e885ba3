#ifndef MNEME_MODEL_MODEL_CONFIG_H_
#define MNEME_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model_config.h"

namespace mneme::model {

// The model's shape as config.json gives it (docs/MODEL_LAYOUT.md lists the
// keys). Plain values; see LoadModelDims.
struct ModelDims {
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
  float rope_theta = 10000.0f;
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int o_groups = 0;
  int sliding_window = 0;
  // One per layer; 0 = sliding window only.
  std::vector<int> compress_ratios;
  int num_experts = 0;
  int experts_per_token = 0;
  int num_shared_experts = 0;
  int64_t moe_intermediate = 0;
  float routed_scaling = 1.0f;
  // <= 0: no clamp.
  float swiglu_limit = 0.0f;
  // FP8 weight block [rows, cols].
  int fp8_block_rows = 128;
  int fp8_block_cols = 128;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  // Layers with an Engram module, ascending.
  std::vector<int> engram_layers;

  bool IsEngramLayer(int layer) const;
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
