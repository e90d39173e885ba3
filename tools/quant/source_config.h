#ifndef MNEME_TOOLS_QUANT_SOURCE_CONFIG_H_
#define MNEME_TOOLS_QUANT_SOURCE_CONFIG_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace mneme::quant {

// The source checkpoint's config.json as text for the output checkpoint,
// with `edit` applied to the section that holds the model keys: text_config
// when it is an object (and contains `text_config_marker`, unless that is
// empty), else the top level. NotFound / DataLoss naming the file when it
// is missing or not a JSON object.
absl::StatusOr<std::string> RewriteSourceConfig(
    const std::string& source_dir, const std::string& text_config_marker,
    const std::function<void(nlohmann::ordered_json& section)>& edit);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_SOURCE_CONFIG_H_
