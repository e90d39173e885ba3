#include "checkpoint/config_json_edit.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/model_config.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace mneme::checkpoint {

absl::StatusOr<std::string> EditConfigJsonText(
    absl::string_view json_text, absl::string_view file_name,
    absl::string_view text_config_marker, const ConfigSectionEdit& edit) {
  if (json_text.size() > kMaxConfigFileBytes) {
    return absl::DataLossError(absl::StrCat("'", file_name, "' is larger than ",
                                            kMaxConfigFileBytes, " bytes"));
  }
  JsonParseOptions options;
  options.max_bytes = kMaxConfigFileBytes;
  options.reject_duplicate_keys = false;
  ASSIGN_OR_RETURN(nlohmann::ordered_json config,
                   ParseOrderedJsonDocument(
                       json_text, absl::StrCat("'", file_name, "'"), options));
  if (!config.is_object()) {
    return absl::DataLossError(
        absl::StrCat("'", file_name, "' is not a JSON object"));
  }
  nlohmann::ordered_json* section = &config;
  auto text_config = config.find("text_config");
  if (text_config != config.end() && text_config->is_object() &&
      (text_config_marker.empty() ||
       text_config->contains(std::string(text_config_marker)))) {
    section = &*text_config;
  }
  edit(*section);
  return JsonDump(config, 2) + "\n";
}

absl::StatusOr<std::string> EditConfigJson(const std::string& checkpoint_dir,
                                           absl::string_view text_config_marker,
                                           const ConfigSectionEdit& edit) {
  const std::string path = absl::StrCat(checkpoint_dir, "/", kConfigFileName);
  ASSIGN_OR_RETURN(std::string text,
                   mneme::ReadSmallFile(path, kMaxConfigFileBytes));
  return EditConfigJsonText(text, path, text_config_marker, edit);
}

}  // namespace mneme::checkpoint
