#include "engram_store/hashing/hash_layout.h"

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engram_store/hashing/multipliers.h"
#include "engram_store/hashing/primes.h"

namespace mneme::engram {
namespace {

// Bounds that keep every derived size well inside int: far above any model.
constexpr int kMaxNgramSizeLimit = 64;
constexpr int kMaxHeadsLimit = 4096;

absl::Status ValidateConfig(const checkpoint::EngramConfig& config) {
  if (config.layer_ids.empty()) {
    return absl::InvalidArgumentError("engram_layer_ids is empty");
  }
  absl::flat_hash_set<int> seen;
  for (int layer_id : config.layer_ids) {
    if (layer_id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "engram_layer_ids: layer id must be >= 0, got ", layer_id));
    }
    if (!seen.insert(layer_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("engram_layer_ids: duplicate layer id ", layer_id));
    }
  }
  if (config.num_embeddings.size() != config.layer_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_num_embeddings has ", config.num_embeddings.size(),
        " entries but engram_layer_ids has ", config.layer_ids.size()));
  }
  if (config.max_ngram_size < 2 || config.max_ngram_size > kMaxNgramSizeLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("engram_max_ngram_size must be in [2, ",
                     kMaxNgramSizeLimit, "], got ", config.max_ngram_size));
  }
  if (config.n_heads < 1 || config.n_heads > kMaxHeadsLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("engram_n_heads must be in [1, ", kMaxHeadsLimit,
                     "], got ", config.n_heads));
  }
  if (config.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_vocab_size must be >= 1, got ", config.vocab_size));
  }
  if (config.compressed_vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("engram_compressed_vocab_size must be >= 1, got ",
                     config.compressed_vocab_size));
  }
  if (config.pad_token_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_pad_token_id must be >= 0, got ", config.pad_token_id));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HashLayout> HashLayout::Create(
    const checkpoint::EngramConfig& config) {
  RETURN_IF_ERROR(ValidateConfig(config));
  const int num_layers = static_cast<int>(config.layer_ids.size());
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> primes,
                   SearchColumnPrimes(config.vocab_size, num_layers,
                                      config.max_ngram_size, config.n_heads));

  HashLayout layout;
  layout.max_ngram_size_ = config.max_ngram_size;
  layout.n_heads_ = config.n_heads;
  layout.pad_token_id_ = config.pad_token_id;
  for (int i = 0; i < num_layers; ++i) {
    LayerHashLayout layer;
    layer.layer_id = config.layer_ids[i];
    ASSIGN_OR_RETURN(
        std::vector<int64_t> multipliers,
        LayerMultipliers(layer.layer_id, config.compressed_vocab_size,
                         config.max_ngram_size));
    layer.multipliers = std::move(multipliers);
    layer.primes = std::move(primes[i]);
    layer.offsets.reserve(layer.primes.size());
    for (int64_t prime : layer.primes) {
      // Primes are <= 2^62 + small and there are at most 64 * 4096 of them
      // per layer; the running sum is checked before it could overflow.
      if (layer.num_rows > INT64_MAX - prime) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Engram layer ", layer.layer_id,
            ": table rows overflow int64 (engram_vocab_size too large)"));
      }
      layer.offsets.push_back(layer.num_rows);
      layer.num_rows += prime;
    }
    if (layer.num_rows != config.num_embeddings[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Engram layer ", layer.layer_id, ": engram_num_embeddings is ",
          config.num_embeddings[i], " but the layer's ", layer.primes.size(),
          " column primes sum to ", layer.num_rows));
    }
    layout.layers_.push_back(std::move(layer));
  }
  return layout;
}

absl::StatusOr<int> HashLayout::LayerIndex(int layer_id) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].layer_id == layer_id) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", layer_id, " has no Engram module"));
}

}  // namespace mneme::engram
