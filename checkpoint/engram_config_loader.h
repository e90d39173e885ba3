#ifndef MNEME_CHECKPOINT_ENGRAM_CONFIG_LOADER_H_
#define MNEME_CHECKPOINT_ENGRAM_CONFIG_LOADER_H_

#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/engram_config.h"
#include "checkpoint/model_config.h"

namespace mneme::checkpoint {

// Fills an EngramConfig from the Engram keys of a config.json (ENGRAM.md,
// "Config keys"), each looked up under text_config first, then at the top
// level.
//
// Required: engram_layer_ids (non-empty, ascending, each in [0, 2^31)),
// engram_num_embeddings (one positive count per layer), engram_max_ngram_size
// (2..32), engram_n_heads (1..1024), engram_head_dim (must be 256),
// engram_vocab_size (> 0), engram_compressed_vocab_size (> 0),
// engram_pad_token_id (>= 0).
// Optional: engram_quant ("fp8" or absent/null -> kFp8, "nvfp4" -> kNvfp4).
// With "nvfp4": engram_quant_block_size (optional, must be 16),
// engram_quant_method (optional string) and engram_quant_global_scale
// (required: an object with a finite positive number for every layer id,
// keyed by the id as a string). Without it those keys are ignored.
//
// Every failure is InvalidArgument naming the key (and layer) and the file:
// a missing required key, a wrong type, a value out of range, a length
// mismatch between engram_num_embeddings and engram_layer_ids, an unknown
// engram_quant, a missing global scale.
absl::StatusOr<EngramConfig> ParseEngramConfig(const ModelConfig& config);

// ModelConfig::Create(config_path), then ParseEngramConfig().
absl::StatusOr<EngramConfig> LoadEngramConfig(const std::string& config_path);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_ENGRAM_CONFIG_LOADER_H_
