#include "common/json.h"

#include <limits>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme {
namespace {

using nlohmann::json;

// Tracks the keys of each open object during a parse.
class DuplicateKeyTracker {
 public:
  explicit DuplicateKeyTracker(std::optional<std::string>* duplicate)
      : duplicate_(duplicate) {}

  template <typename Json>
  bool OnEvent(json::parse_event_t event, const Json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys_.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys_.empty()) keys_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_.empty() && parsed.is_string()) {
          const std::string& key =
              parsed.template get_ref<const std::string&>();
          if (!keys_.back().insert(key).second && !*duplicate_) {
            *duplicate_ = key;
          }
        }
        break;
      default:
        break;
    }
    return true;  // Keep every value.
  }

 private:
  std::vector<std::set<std::string>> keys_;
  std::optional<std::string>* duplicate_;
};

// The nesting depth of `text` (see JsonNestingDepth), counted up to
// `stop_above` + 1 at most: the scan ends at the first bracket past it.
int NestingDepthUpTo(absl::string_view text, int stop_above) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > stop_above) break;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Parses `text` (already checked for depth) into a Json, discarded when
// invalid; records the first repeated key.
template <typename Json>
Json ParseChecked(absl::string_view text,
                  std::optional<std::string>* duplicate_key) {
  // nlohmann stops at a NUL byte as if the input ended there, which would
  // accept "{}\0<anything>". JSON never contains a raw NUL.
  if (text.find('\0') != absl::string_view::npos) {
    return Json(json::value_t::discarded);
  }
  DuplicateKeyTracker tracker(duplicate_key);
  return Json::parse(
      text.begin(), text.end(),
      [&tracker](int /*depth*/, json::parse_event_t event, Json& parsed) {
        return tracker.OnEvent(event, parsed);
      },
      /*allow_exceptions=*/false);
}

// At most kMaxQuotedKeyBytes of `key`, "..." marking a cut.
constexpr size_t kMaxQuotedKeyBytes = 80;

std::string QuotedKey(absl::string_view key) {
  if (key.size() <= kMaxQuotedKeyBytes) return std::string(key);
  return absl::StrCat(key.substr(0, kMaxQuotedKeyBytes), "...");
}

template <typename Json>
absl::StatusOr<Json> ParseDocument(absl::string_view text,
                                   absl::string_view origin,
                                   const JsonParseOptions& options) {
  if (text.size() > options.max_bytes) {
    return absl::Status(
        options.error_code,
        absl::StrCat(origin, " is ", text.size(),
                     " bytes, more than the limit of ", options.max_bytes));
  }
  if (NestingDepthUpTo(text, options.max_depth) > options.max_depth) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, " nests arrays / objects deeper than the limit of ",
        options.max_depth));
  }
  std::optional<std::string> duplicate_key;
  Json value = ParseChecked<Json>(text, &duplicate_key);
  if (value.is_discarded()) {
    return absl::Status(options.error_code,
                        absl::StrCat(origin, " is not valid JSON"));
  }
  if (options.reject_duplicate_keys && duplicate_key) {
    return absl::Status(options.error_code,
                        absl::StrCat(origin, " repeats the key '",
                                     QuotedKey(*duplicate_key), "'"));
  }
  return value;
}

// Containers more than kSnippetDepth levels below the quoted value are
// elided.
constexpr int kSnippetDepth = 4;

// Appends a rendering of `value` to `out` until out->size() passes `budget`.
template <typename Json>
void AppendSnippet(const Json& value, int depth, size_t budget,
                   std::string* out) {
  if (out->size() > budget) return;
  if (value.is_string()) {
    const std::string& s = value.template get_ref<const std::string&>();
    // Cut before quoting so that a huge string is never copied whole.
    const size_t room = budget - out->size() + 1;
    out->append(JsonDump(Json(s.size() > room ? s.substr(0, room) : s)));
    return;
  }
  if (!value.is_array() && !value.is_object()) {
    out->append(JsonDump(value));
    return;
  }
  const bool is_array = value.is_array();
  if (depth >= kSnippetDepth && !value.empty()) {
    out->append(is_array ? "[...]" : "{...}");
    return;
  }
  out->push_back(is_array ? '[' : '{');
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (out->size() > budget) return;
    if (!first) out->push_back(',');
    first = false;
    if (!is_array) {
      AppendSnippet(Json(it.key()), depth + 1, budget, out);
      out->push_back(':');
    }
    AppendSnippet(it.value(), depth + 1, budget, out);
  }
  out->push_back(is_array ? ']' : '}');
}

template <typename Json>
std::string Snippet(const Json& value, size_t max_chars) {
  std::string out;
  AppendSnippet(value, 0, max_chars, &out);
  if (out.size() > max_chars) {
    // Cut at a UTF-8 boundary.
    size_t cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    out.resize(cut);
    out.append("...");
  }
  return out;
}

}  // namespace

int JsonNestingDepth(absl::string_view text) {
  return NestingDepthUpTo(text, std::numeric_limits<int>::max());
}

ParsedJson ParseJson(absl::string_view text, int max_depth) {
  ParsedJson result;
  if (NestingDepthUpTo(text, max_depth) > max_depth) {
    result.too_deep = true;
    result.value = json(json::value_t::discarded);
    return result;
  }
  result.value = ParseChecked<json>(text, &result.duplicate_key);
  return result;
}

std::string JsonSnippet(const nlohmann::json& value, size_t max_chars) {
  return Snippet(value, max_chars);
}

std::string JsonSnippet(const nlohmann::ordered_json& value, size_t max_chars) {
  return Snippet(value, max_chars);
}

std::optional<uint64_t> JsonToUint64(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

std::optional<int64_t> JsonToInt64(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(v);
    }
    return std::nullopt;
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

bool IsValidUtf8(absl::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra;
    uint32_t min;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      extra = 1;
      min = 0x80;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      min = 0x800;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      min = 0x10000;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    p += extra + 1;
  }
  return true;
}

absl::StatusOr<nlohmann::json> ParseJsonDocument(
    absl::string_view text, absl::string_view origin,
    const JsonParseOptions& options) {
  return ParseDocument<nlohmann::json>(text, origin, options);
}

absl::StatusOr<nlohmann::ordered_json> ParseOrderedJsonDocument(
    absl::string_view text, absl::string_view origin,
    const JsonParseOptions& options) {
  return ParseDocument<nlohmann::ordered_json>(text, origin, options);
}

std::optional<int64_t> JsonToIntInRange(const json& value, int64_t min,
                                        int64_t max) {
  const std::optional<int64_t> v = JsonToInt64(value);
  if (!v || *v < min || *v > max) return std::nullopt;
  return v;
}

std::optional<int64_t> JsonTokenId(const json& value) {
  // Hugging Face token ids are u32.
  return JsonToIntInRange(value, 0, (int64_t{1} << 32) - 1);
}

std::string JsonPath(absl::string_view parent, absl::string_view key) {
  if (parent.empty()) return std::string(key);
  return absl::StrCat(parent, ".", key);
}

std::string JsonIndexPath(absl::string_view parent, size_t index) {
  return absl::StrCat(parent, "[", index, "]");
}

absl::Status JsonFieldReader::Error(absl::string_view path,
                                    absl::string_view what) const {
  if (path.empty()) {
    return absl::Status(error_code_, absl::StrCat(origin_, ": ", what));
  }
  return absl::Status(error_code_,
                      absl::StrCat(origin_, ": ", path, ": ", what));
}

absl::StatusOr<const json*> JsonFieldReader::Find(const json& object,
                                                  absl::string_view path,
                                                  absl::string_view key) const {
  if (!object.is_object()) return Error(path, "not a JSON object");
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<const json*> JsonFieldReader::Required(
    const json& object, absl::string_view path, absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Find(object, path, key));
  if (value == nullptr) return Error(JsonPath(path, key), "missing");
  return value;
}

absl::StatusOr<std::string> JsonFieldReader::String(
    const json& object, absl::string_view path, absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  if (!value->is_string()) return Error(JsonPath(path, key), "not a string");
  return value->get<std::string>();
}

absl::StatusOr<bool> JsonFieldReader::Bool(const json& object,
                                           absl::string_view path,
                                           absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  if (!value->is_boolean()) {
    return Error(JsonPath(path, key), "not a boolean");
  }
  return value->get<bool>();
}

absl::StatusOr<double> JsonFieldReader::Number(const json& object,
                                               absl::string_view path,
                                               absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  if (!value->is_number()) return Error(JsonPath(path, key), "not a number");
  return value->get<double>();
}

absl::StatusOr<const json*> JsonFieldReader::Object(
    const json& object, absl::string_view path, absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  if (!value->is_object()) return Error(JsonPath(path, key), "not an object");
  return value;
}

absl::StatusOr<const json*> JsonFieldReader::Array(
    const json& object, absl::string_view path, absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  if (!value->is_array()) return Error(JsonPath(path, key), "not an array");
  return value;
}

namespace {

// `value` (at `path`) as an integer in [min, max], or the reader's error.
absl::StatusOr<int64_t> IntValue(const JsonFieldReader& reader,
                                 const json& value, absl::string_view path,
                                 int64_t min, int64_t max) {
  const std::optional<int64_t> v = JsonToInt64(value);
  if (!v) {
    return reader.Error(
        path, value.is_number_unsigned() ? "too large" : "not an integer");
  }
  if (*v < min || *v > max) {
    return reader.Error(path,
                        absl::StrCat(*v, " is outside [", min, ", ", max, "]"));
  }
  return *v;
}

}  // namespace

absl::StatusOr<int64_t> JsonFieldReader::Int(const json& object,
                                             absl::string_view path,
                                             absl::string_view key, int64_t min,
                                             int64_t max) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  return IntValue(*this, *value, JsonPath(path, key), min, max);
}

absl::StatusOr<uint64_t> JsonFieldReader::Uint(const json& object,
                                               absl::string_view path,
                                               absl::string_view key) const {
  ASSIGN_OR_RETURN(const json* value, Required(object, path, key));
  const std::optional<uint64_t> v = JsonToUint64(*value);
  if (!v) return Error(JsonPath(path, key), "not a non-negative integer");
  return *v;
}

absl::StatusOr<std::vector<int64_t>> JsonFieldReader::IntArray(
    const json& object, absl::string_view path, absl::string_view key,
    int64_t min, int64_t max) const {
  ASSIGN_OR_RETURN(const json* array, Array(object, path, key));
  const std::string array_path = JsonPath(path, key);
  std::vector<int64_t> values;
  values.reserve(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    ASSIGN_OR_RETURN(
        const int64_t v,
        IntValue(*this, (*array)[i], JsonIndexPath(array_path, i), min, max));
    values.push_back(v);
  }
  return values;
}

absl::StatusOr<std::string> JsonFieldReader::StringOr(
    const json& object, absl::string_view path, absl::string_view key,
    absl::string_view fallback) const {
  ASSIGN_OR_RETURN(const json* value, Find(object, path, key));
  if (value == nullptr) return std::string(fallback);
  if (!value->is_string()) return Error(JsonPath(path, key), "not a string");
  return value->get<std::string>();
}

absl::StatusOr<bool> JsonFieldReader::BoolOr(const json& object,
                                             absl::string_view path,
                                             absl::string_view key,
                                             bool fallback) const {
  ASSIGN_OR_RETURN(const json* value, Find(object, path, key));
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) {
    return Error(JsonPath(path, key), "not a boolean");
  }
  return value->get<bool>();
}

}  // namespace mneme
