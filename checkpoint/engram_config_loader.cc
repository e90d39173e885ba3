#include "checkpoint/engram_config_loader.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/row_format.h"

namespace mneme::checkpoint {

using nlohmann::json;

absl::StatusOr<EngramConfig> ParseEngramConfig(const ModelConfig& config) {
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  EngramConfig result;

  ASSIGN_OR_RETURN(std::vector<int64_t> layer_ids,
                   config.GetIntArray("engram_layer_ids", 0, kIntMax));
  if (layer_ids.empty()) {
    return config.KeyError("engram_layer_ids", "empty");
  }
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    if (i > 0 && layer_ids[i] <= layer_ids[i - 1]) {
      return config.KeyError("engram_layer_ids", "not strictly ascending");
    }
    result.layer_ids.push_back(static_cast<int>(layer_ids[i]));
  }

  ASSIGN_OR_RETURN(std::vector<int64_t> num_embeddings,
                   config.GetIntArray("engram_num_embeddings", 1, kInt64Max));
  if (num_embeddings.size() != result.layer_ids.size()) {
    return config.KeyError("engram_num_embeddings",
                           absl::StrCat("has ", num_embeddings.size(),
                                        " entries but engram_layer_ids has ",
                                        result.layer_ids.size()));
  }
  result.num_embeddings = std::move(num_embeddings);

  ASSIGN_OR_RETURN(const int64_t max_ngram_size,
                   config.GetIntInRange("engram_max_ngram_size", 2, 32));
  result.max_ngram_size = static_cast<int>(max_ngram_size);
  ASSIGN_OR_RETURN(const int64_t n_heads,
                   config.GetIntInRange("engram_n_heads", 1, 1024));
  result.n_heads = static_cast<int>(n_heads);
  ASSIGN_OR_RETURN(const int64_t head_dim,
                   config.GetIntInRange("engram_head_dim", formats::kRowDim,
                                        formats::kRowDim));
  result.head_dim = static_cast<int>(head_dim);
  ASSIGN_OR_RETURN(result.vocab_size,
                   config.GetIntInRange("engram_vocab_size", 1, kInt64Max));
  ASSIGN_OR_RETURN(
      result.compressed_vocab_size,
      config.GetIntInRange("engram_compressed_vocab_size", 1, kInt64Max));
  ASSIGN_OR_RETURN(result.pad_token_id,
                   config.GetIntInRange("engram_pad_token_id", 0, kInt64Max));

  result.format = formats::RowFormat::kFp8;
  if (config.Find("engram_quant") != nullptr) {
    ASSIGN_OR_RETURN(std::string quant, config.GetString("engram_quant"));
    if (quant == "nvfp4") {
      result.format = formats::RowFormat::kNvfp4;
    } else if (quant != "fp8") {
      return config.KeyError("engram_quant",
                             absl::StrCat("unknown value \"", quant,
                                          "\" (expected \"nvfp4\" or "
                                          "\"fp8\")"));
    }
  }
  if (result.format != formats::RowFormat::kNvfp4) return result;

  if (config.Find("engram_quant_block_size") != nullptr) {
    RETURN_IF_ERROR(config
                        .GetIntInRange("engram_quant_block_size",
                                       formats::kNvfp4BlockSize,
                                       formats::kNvfp4BlockSize)
                        .status());
  }
  result.quant_block_size = formats::kNvfp4BlockSize;
  if (config.Find("engram_quant_method") != nullptr) {
    ASSIGN_OR_RETURN(result.quant_method,
                     config.GetString("engram_quant_method"));
  }
  const json* scales = config.Find("engram_quant_global_scale");
  if (scales == nullptr) {
    return config.KeyError("engram_quant_global_scale",
                           "missing (required with engram_quant \"nvfp4\")");
  }
  if (!scales->is_object()) {
    return config.KeyError("engram_quant_global_scale", "not an object");
  }
  for (int layer : result.layer_ids) {
    auto it = scales->find(std::to_string(layer));
    if (it == scales->end()) {
      return config.KeyError("engram_quant_global_scale",
                             absl::StrCat("no scale for layer ", layer));
    }
    if (!it->is_number()) {
      return config.KeyError(
          "engram_quant_global_scale",
          absl::StrCat("scale for layer ", layer, " is not a number"));
    }
    const double scale = it->get<double>();
    // Checked as a double first: casting an out-of-range double to float is
    // undefined.
    if (!std::isfinite(scale) || scale <= 0.0 ||
        scale > std::numeric_limits<float>::max() ||
        static_cast<float>(scale) <= 0.0f) {
      return config.KeyError(
          "engram_quant_global_scale",
          absl::StrCat("scale for layer ", layer, " (", it->dump(),
                       ") is not a finite positive fp32"));
    }
    result.global_scales[layer] = static_cast<float>(scale);
  }
  return result;
}

absl::StatusOr<EngramConfig> LoadEngramConfig(const std::string& config_path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ModelConfig> config,
                   ModelConfig::Create(config_path));
  return ParseEngramConfig(*config);
}

}  // namespace mneme::checkpoint
