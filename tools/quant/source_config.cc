#include "tools/quant/source_config.h"

#include "checkpoint/config_json_edit.h"

namespace mneme::quant {

absl::StatusOr<std::string> RewriteSourceConfig(
    const std::string& source_dir, const std::string& text_config_marker,
    const std::function<void(nlohmann::ordered_json& section)>& edit) {
  return checkpoint::EditConfigJson(source_dir, text_config_marker, edit);
}

}  // namespace mneme::quant
