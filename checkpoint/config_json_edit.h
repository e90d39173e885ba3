#ifndef MNEME_CHECKPOINT_CONFIG_JSON_EDIT_H_
#define MNEME_CHECKPOINT_CONFIG_JSON_EDIT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {

// Order-preserving edits of a checkpoint's config.json, for the tools that
// write a derived checkpoint (the quantizers): the output's config.json is
// the source's with a few keys set or removed, every other key in its
// original place. ModelConfig (model_config.h) is for reading typed values
// and does not keep key order; this is the one other place that parses
// config.json.

// Edits the model section of one config.json: `edit` receives text_config
// when it is an object (and contains the key `text_config_marker`, unless
// that is empty), else the top-level object. Keys keep their order; new
// keys go last in the section.
using ConfigSectionEdit = std::function<void(nlohmann::ordered_json& section)>;

// Parses `json_text` (bounded by kMaxConfigFileBytes), applies `edit` and
// returns the document as text: two-space indentation, a trailing newline,
// invalid UTF-8 replaced by U+FFFD. DataLoss naming `file_name` if the text
// is larger than kMaxConfigFileBytes, is not valid JSON, or is not a JSON
// object.
absl::StatusOr<std::string> EditConfigJsonText(
    absl::string_view json_text, absl::string_view file_name,
    absl::string_view text_config_marker, const ConfigSectionEdit& edit);

// The same over <checkpoint_dir>/config.json. NotFound naming the file if it
// is missing; errno-derived codes if it cannot be read.
absl::StatusOr<std::string> EditConfigJson(const std::string& checkpoint_dir,
                                           absl::string_view text_config_marker,
                                           const ConfigSectionEdit& edit);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_CONFIG_JSON_EDIT_H_
