#ifndef MNEME_COMMON_JSON_UTIL_H_
#define MNEME_COMMON_JSON_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme {

// Exception-free helpers around nlohmann::json for the checkpoint files.
// nlohmann throws from parse() (unless told not to), from get<T>() on a type
// mismatch and from dump() on invalid UTF-8; these helpers never let it.

// Result of ParseJson().
struct ParsedJson {
  // The document; is_discarded() if the text is not valid JSON.
  nlohmann::json value;
  // The first key that repeats within one object, if any (nlohmann would
  // silently keep only its last value).
  std::optional<std::string> duplicate_key;

  bool valid() const { return !value.is_discarded(); }
};

// Parses `text` strictly (no comments, no NUL bytes, no trailing garbage
// besides whitespace) without throwing.
ParsedJson ParseJson(absl::string_view text);

// A JSON integer in [0, 2^64), or nullopt (negative, fractional, a number
// too large for 64 bits - which nlohmann parses as a float - or no number).
std::optional<uint64_t> JsonToUint64(const nlohmann::json& value);

// A JSON integer in [-2^63, 2^63), or nullopt.
std::optional<int64_t> JsonToInt64(const nlohmann::json& value);

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), i.e. whether nlohmann can dump it.
bool IsValidUtf8(absl::string_view text);

}  // namespace mneme

#endif  // MNEME_COMMON_JSON_UTIL_H_
