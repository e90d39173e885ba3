#include "common/json_util.h"

#include <limits>
#include <set>
#include <vector>

namespace mneme {
namespace {

using nlohmann::json;

// Tracks the keys of each open object during a parse.
class DuplicateKeyTracker {
 public:
  explicit DuplicateKeyTracker(std::optional<std::string>* duplicate)
      : duplicate_(duplicate) {}

  bool OnEvent(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys_.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys_.empty()) keys_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_.empty() && parsed.is_string()) {
          const std::string& key = parsed.get_ref<const std::string&>();
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

}  // namespace

ParsedJson ParseJson(absl::string_view text) {
  ParsedJson result;
  // nlohmann stops at a NUL byte as if the input ended there, which would
  // accept "{}\0<anything>". JSON never contains a raw NUL.
  if (text.find('\0') != absl::string_view::npos) {
    result.value = json(json::value_t::discarded);
    return result;
  }
  DuplicateKeyTracker tracker(&result.duplicate_key);
  result.value = json::parse(
      text.begin(), text.end(),
      [&tracker](int /*depth*/, json::parse_event_t event, json& parsed) {
        return tracker.OnEvent(event, parsed);
      },
      /*allow_exceptions=*/false);
  return result;
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

}  // namespace mneme
