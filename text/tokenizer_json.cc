#include "text/tokenizer_json.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::text {

absl::StatusOr<std::string> TypeOf(const nlohmann::json& spec,
                                   absl::string_view what) {
  if (!spec.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a JSON object: ", JsonSnippet(spec)));
  }
  const auto type = spec.find("type");
  if (type == spec.end() || !type->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has no \"type\" string"));
  }
  return type->get<std::string>();
}

absl::StatusOr<std::string> StringField(const nlohmann::json& spec,
                                        const char* field,
                                        absl::string_view what) {
  const auto it = spec.find(field);
  if (it == spec.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " needs a string \"", field, "\""));
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> BoolField(const nlohmann::json& spec, const char* field,
                               bool default_value, absl::string_view what) {
  const auto it = spec.find(field);
  if (it == spec.end() || it->is_null()) return default_value;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " field \"", field, "\" is not a boolean: ", JsonSnippet(*it)));
  }
  return it->get<bool>();
}

absl::StatusOr<Pattern> PatternOf(const nlohmann::json& spec,
                                  absl::string_view what) {
  const auto it = spec.find("pattern");
  if (it != spec.end() && it->is_object() && it->size() == 1) {
    if (const auto s = it->find("String"); s != it->end() && s->is_string()) {
      return Pattern{s->get<std::string>(), /*is_regex=*/false};
    }
    if (const auto r = it->find("Regex"); r != it->end() && r->is_string()) {
      return Pattern{r->get<std::string>(), /*is_regex=*/true};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " needs \"pattern\": {\"String\": ...} or {\"Regex\": ...}"));
}

absl::StatusOr<bool> ExpandSequence(
    const nlohmann::json& spec, absl::string_view type, const char* list_key,
    absl::string_view what, int depth,
    const std::function<absl::Status(const nlohmann::json&, int)>& add) {
  if (type != "Sequence") return false;
  if (depth >= kMaxSequenceDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " Sequences nest deeper than the limit of ", kMaxSequenceDepth));
  }
  const auto list = spec.find(list_key);
  if (list == spec.end() || !list->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " Sequence needs a \"", list_key, "\" array"));
  }
  for (const nlohmann::json& member : *list) {
    RETURN_IF_ERROR(add(member, depth + 1));
  }
  return true;
}

}  // namespace mneme::text
