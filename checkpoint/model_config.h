#ifndef MNEME_CHECKPOINT_MODEL_CONFIG_H_
#define MNEME_CHECKPOINT_MODEL_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {

// Largest config.json accepted, bytes.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{16} << 20;

// A checkpoint's config.json. Multimodal checkpoints (V4.1) nest the text
// model's keys under "text_config"; others keep them at the top level. Every
// lookup here tries text_config first, then the top level.
//
// The typed getters are for scalar keys; other sections (e.g. rope_scaling)
// are reached through Find() or root(). Never throws: the json is only
// inspected through type-checked accessors.
//
// Thread-safe: immutable after creation.
class ModelConfig {
 public:
  // Reads and parses `path`. NotFound if it does not exist; DataLoss if it
  // is not valid JSON or repeats a key; InvalidArgument if it is not an
  // object or its "text_config" is present but not an object.
  static absl::StatusOr<std::unique_ptr<ModelConfig>> Create(
      const std::string& path);
  // Same, from text (DataLoss above kMaxConfigFileBytes as well); `file_name`
  // is used in messages.
  static absl::StatusOr<std::unique_ptr<ModelConfig>> Parse(
      absl::string_view json_text, absl::string_view file_name);

  ModelConfig(const ModelConfig&) = delete;
  ModelConfig& operator=(const ModelConfig&) = delete;

  const std::string& file_name() const { return file_name_; }
  // The whole document (an object).
  const nlohmann::json& root() const { return root_; }
  // Whether the document has a "text_config" object.
  bool has_text_config() const { return text_config_ != nullptr; }

  // The value of `key` (text_config first, then top level; then the same
  // for the official inference code's name of a Hugging Face key, e.g.
  // "dim" for "hidden_size"); nullptr if absent. A JSON null counts as
  // absent.
  const nlohmann::json* Find(absl::string_view key) const;
  // Where Find(key) found it: "text_config.<key>" or "<key>" (for messages).
  std::string KeyPath(absl::string_view key) const;

  // Typed getters: InvalidArgument naming the key and the file if the key is
  // missing or has another type (or the integer does not fit).
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetDouble(absl::string_view key) const;  // Any number.
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  // An integer in [min, max]: GetInt's errors, or InvalidArgument
  // "<v> is outside [min, max]".
  absl::StatusOr<int64_t> GetIntInRange(absl::string_view key, int64_t min,
                                        int64_t max) const;
  // An array of integers, each in [min, max]: InvalidArgument if missing,
  // not an array, or for the first element that is not an integer or lies
  // outside the range (naming its index).
  absl::StatusOr<std::vector<int64_t>> GetIntArray(absl::string_view key,
                                                   int64_t min,
                                                   int64_t max) const;

  // InvalidArgument "<file>: key '<path>': <what>".
  absl::Status KeyError(absl::string_view key, absl::string_view what) const;

 private:
  // `key` exactly, text_config first.
  const nlohmann::json* FindExact(absl::string_view key) const;

  ModelConfig(std::string file_name, nlohmann::json root);

  const std::string file_name_;
  const nlohmann::json root_;
  const nlohmann::json* text_config_ = nullptr;  // Points into root_.
};

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_MODEL_CONFIG_H_
