#include "checkpoint/model_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace mneme::checkpoint {
namespace {

using nlohmann::json;

constexpr absl::string_view kTextConfigKey = "text_config";

const json* FindIn(const json& object, absl::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// The official inference code's config names (inference/config.json and its
// ModelArgs) for the Hugging Face keys: a released checkpoint may spell a
// key either way.
struct KeyAlias {
  absl::string_view hf;
  absl::string_view inference;
};
constexpr KeyAlias kAliases[] = {
    {"hidden_size", "dim"},
    {"num_hidden_layers", "n_layers"},
    {"num_attention_heads", "n_heads"},
    {"moe_intermediate_size", "moe_inter_dim"},
    {"num_experts_per_tok", "n_activated_experts"},
    {"routed_scaling_factor", "route_scale"},
    {"scoring_func", "score_func"},
    {"rms_norm_eps", "norm_eps"},
    {"sliding_window", "window_size"},
    {"qk_rope_head_dim", "rope_head_dim"},
    {"num_hash_layers", "n_hash_layers"},
    {"num_nextn_predict_layers", "n_mtp_layers"},
    {"kv_source_layer_ids", "kv_source_layers"},
    {"index_source_layer_ids", "index_source_layers"},
    {"candidate_source_layer_id", "candidate_source_layer"},
    {"engram_pad_token_id", "engram_pad_id"},
    {"dspark_num_experts_per_tok", "dspark_n_activated_experts"},
};

absl::string_view InferenceName(absl::string_view key) {
  for (const KeyAlias& a : kAliases) {
    if (a.hf == key) return a.inference;
  }
  return {};
}

}  // namespace

ModelConfig::ModelConfig(std::string file_name, json root)
    : file_name_(std::move(file_name)), root_(std::move(root)) {
  const json* text_config = FindIn(root_, kTextConfigKey);
  if (text_config != nullptr && text_config->is_object()) {
    text_config_ = text_config;
  }
}

absl::StatusOr<std::unique_ptr<ModelConfig>> ModelConfig::Create(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxConfigFileBytes));
  return Parse(text, path);
}

absl::StatusOr<std::unique_ptr<ModelConfig>> ModelConfig::Parse(
    absl::string_view json_text, absl::string_view file_name) {
  JsonParseOptions parse_options;
  parse_options.max_bytes = kMaxConfigFileBytes;
  ASSIGN_OR_RETURN(
      json root,
      ParseJsonDocument(json_text, absl::StrCat("config '", file_name, "'"),
                        parse_options));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", file_name, "' is not a JSON object"));
  }
  const json* text_config = FindIn(root, kTextConfigKey);
  if (text_config != nullptr && !text_config->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config '", file_name, "': key 'text_config' is not an object"));
  }
  return std::unique_ptr<ModelConfig>(
      new ModelConfig(std::string(file_name), std::move(root)));
}

const json* ModelConfig::FindExact(absl::string_view key) const {
  if (text_config_ != nullptr) {
    if (const json* value = FindIn(*text_config_, key)) return value;
  }
  return FindIn(root_, key);
}

const json* ModelConfig::Find(absl::string_view key) const {
  if (const json* value = FindExact(key)) return value;
  const absl::string_view alias = InferenceName(key);
  return alias.empty() ? nullptr : FindExact(alias);
}

std::string ModelConfig::KeyPath(absl::string_view key) const {
  absl::string_view name = key;
  if (FindExact(key) == nullptr && !InferenceName(key).empty() &&
      FindExact(InferenceName(key)) != nullptr) {
    name = InferenceName(key);
  }
  if (text_config_ != nullptr && FindIn(*text_config_, name) != nullptr) {
    return absl::StrCat(kTextConfigKey, ".", name);
  }
  return std::string(name);
}

absl::Status ModelConfig::KeyError(absl::string_view key,
                                   absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "config '", file_name_, "': key '", KeyPath(key), "': ", what));
}

absl::StatusOr<int64_t> ModelConfig::GetInt(absl::string_view key) const {
  const json* value = Find(key);
  if (value == nullptr) return KeyError(key, "missing");
  std::optional<int64_t> result = JsonToInt64(*value);
  if (!result) return KeyError(key, "not a 64-bit integer");
  return *result;
}

absl::StatusOr<double> ModelConfig::GetDouble(absl::string_view key) const {
  const json* value = Find(key);
  if (value == nullptr) return KeyError(key, "missing");
  if (!value->is_number()) return KeyError(key, "not a number");
  return value->get<double>();
}

absl::StatusOr<std::string> ModelConfig::GetString(
    absl::string_view key) const {
  const json* value = Find(key);
  if (value == nullptr) return KeyError(key, "missing");
  if (!value->is_string()) return KeyError(key, "not a string");
  return value->get<std::string>();
}

absl::StatusOr<bool> ModelConfig::GetBool(absl::string_view key) const {
  const json* value = Find(key);
  if (value == nullptr) return KeyError(key, "missing");
  if (!value->is_boolean()) return KeyError(key, "not a boolean");
  return value->get<bool>();
}

absl::StatusOr<int64_t> ModelConfig::GetIntInRange(absl::string_view key,
                                                   int64_t min,
                                                   int64_t max) const {
  ASSIGN_OR_RETURN(const int64_t value, GetInt(key));
  if (value < min || value > max) {
    return KeyError(key,
                    absl::StrCat(value, " is outside [", min, ", ", max, "]"));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> ModelConfig::GetIntArray(
    absl::string_view key, int64_t min, int64_t max) const {
  const json* value = Find(key);
  if (value == nullptr) return KeyError(key, "missing");
  if (!value->is_array()) return KeyError(key, "not an array");
  std::vector<int64_t> result;
  result.reserve(value->size());
  for (const json& element : *value) {
    const std::optional<int64_t> v = JsonToInt64(element);
    if (!v) {
      return KeyError(
          key, absl::StrCat("element ", result.size(), " is not an integer"));
    }
    if (*v < min || *v > max) {
      return KeyError(key, absl::StrCat("element ", result.size(), " (", *v,
                                        ") is outside [", min, ", ", max, "]"));
    }
    result.push_back(*v);
  }
  return result;
}

}  // namespace mneme::checkpoint
