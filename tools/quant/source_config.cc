#include "tools/quant/source_config.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/model_config.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace mneme::quant {

absl::StatusOr<std::string> RewriteSourceConfig(
    const std::string& source_dir, const std::string& text_config_marker,
    const std::function<void(nlohmann::ordered_json& section)>& edit) {
  const std::string path =
      absl::StrCat(source_dir, "/", checkpoint::kConfigFileName);
  ASSIGN_OR_RETURN(std::string text,
                   mneme::ReadSmallFile(path, checkpoint::kMaxConfigFileBytes));
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(text, nullptr, false);
  if (!config.is_object()) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is not a JSON object"));
  }
  nlohmann::ordered_json* section = &config;
  auto text_config = config.find("text_config");
  if (text_config != config.end() && text_config->is_object() &&
      (text_config_marker.empty() ||
       text_config->contains(text_config_marker))) {
    section = &*text_config;
  }
  edit(*section);
  return JsonDump(config, 2) + "\n";
}

}  // namespace mneme::quant
