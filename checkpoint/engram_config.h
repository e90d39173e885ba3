#ifndef MNEME_CHECKPOINT_ENGRAM_CONFIG_H_
#define MNEME_CHECKPOINT_ENGRAM_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/row_format.h"

namespace mneme::checkpoint {

// The Engram keys of a checkpoint's config.json (top level or under
// `text_config`); see ENGRAM.md "Config keys". Plain data: the checkpoint
// loader fills and validates it, hashing and the store read it.
struct EngramConfig {
  // engram_layer_ids: the layers that have an Engram module, ascending.
  std::vector<int> layer_ids;
  // engram_num_embeddings: rows per table, one per entry of layer_ids
  // (must equal the sum of that layer's column primes).
  std::vector<int64_t> num_embeddings;
  // engram_max_ngram_size: n-gram orders 2..max_ngram_size. V4.1: 4.
  int max_ngram_size = 4;
  // engram_n_heads: hash heads per order. V4.1: 8.
  int n_heads = 8;
  // engram_head_dim: values per row. Only 256 is supported.
  int head_dim = 256;
  // engram_vocab_size: start of the prime search (not a vocabulary).
  int64_t vocab_size = 0;
  // engram_compressed_vocab_size: size of the normalized token-id space.
  int64_t compressed_vocab_size = 0;
  // engram_pad_token_id: token whose compressed id pads missing history.
  int64_t pad_token_id = 2;
  // kFp8 unless engram_quant == "nvfp4".
  formats::RowFormat format = formats::RowFormat::kFp8;
  // engram_quant_block_size (NVFP4 only): 16.
  int quant_block_size = 16;
  // engram_quant_method (NVFP4 only), informational, e.g. "gptq-mse".
  std::string quant_method;
  // engram_quant_global_scale (NVFP4 only): layer id -> fp32 global scale.
  std::map<int, float> global_scales;

  // Hash columns per layer: (max_ngram_size - 1) * n_heads (24 for V4.1).
  int NumColumns() const { return (max_ngram_size - 1) * n_heads; }
};

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_ENGRAM_CONFIG_H_
