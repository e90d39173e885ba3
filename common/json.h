#ifndef MNEME_COMMON_JSON_H_
#define MNEME_COMMON_JSON_H_

// The one exception-free way to read JSON in Mneme (checkpoint files,
// tokenizer files, manifests, tool reports). nlohmann::json throws from
// parse() (unless told not to), from get<T>() on a type mismatch and from
// dump() on invalid UTF-8; nothing here lets it.
//
// Three layers, from strictest to most lenient:
//   - ParseJson / ParseJsonDocument / ParseOrderedJsonDocument: strict
//     parsing with a size limit, a nesting depth limit (kMaxJsonDepth) and
//     duplicate-key detection.
//   - JsonFieldReader: typed access to required and optional fields whose
//     errors name the document and the field's path ("model.vocab",
//     "layers[2].count") and carry one status code chosen by the caller.
//   - JsonToInt64 / JsonToUint64 / JsonToIntInRange / JsonFieldOr: value
//     conversions that return nullopt or a fallback instead of an error.
// Plus IsValidUtf8, JsonDump (text that never throws) and JsonSnippet (a
// bounded excerpt of an untrusted value for an error message).
//
// Every parse goes through the depth limit: nlohmann parses iteratively, but
// copying, comparing, dumping or walking a value recurses once per level, so
// a file of 100k '[' would overflow the stack later.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme {

// ---------------------------------------------------------------------------
// Parsing.

// Deepest nesting of arrays / objects any parse here accepts by default.
// Real Mneme inputs (config.json, tokenizer.json, manifests, chat messages
// with tool schemas) stay far below it.
inline constexpr int kMaxJsonDepth = 128;

// The deepest nesting of arrays and objects in `text`, counting brackets
// outside strings (`text` may be invalid JSON; the parser judges that).
// Linear, no recursion.
int JsonNestingDepth(absl::string_view text);

// Result of ParseJson().
struct ParsedJson {
  // The document; is_discarded() if the text is not valid JSON.
  nlohmann::json value;
  // The first key that repeats within one object, if any (nlohmann would
  // silently keep only its last value).
  std::optional<std::string> duplicate_key;
  // Whether the text was refused, unparsed, for nesting deeper than the
  // limit (value is then discarded).
  bool too_deep = false;

  bool valid() const { return !value.is_discarded(); }
};

// Parses `text` strictly (no comments, no NUL bytes, no trailing garbage
// besides whitespace) without throwing. Text nesting deeper than `max_depth`
// is not parsed (too_deep). No size limit: callers that read untrusted files
// bound the size when reading (ReadSmallFile) or use ParseJsonDocument.
ParsedJson ParseJson(absl::string_view text, int max_depth = kMaxJsonDepth);

struct JsonParseOptions {
  // Largest accepted text, bytes. Default: 64 MiB.
  uint64_t max_bytes = uint64_t{64} << 20;
  // Whether a key repeated within one object is an error. Default: true.
  bool reject_duplicate_keys = true;
  // Deepest accepted nesting of arrays / objects. Default: kMaxJsonDepth.
  int max_depth = kMaxJsonDepth;
  // Code of every error but the depth limit. Default: DataLoss (a corrupt
  // file).
  absl::StatusCode error_code = absl::StatusCode::kDataLoss;
};

// ParseJson() as a status: an error with options.error_code if `text` is
// larger than options.max_bytes, is not valid JSON, or repeats a key. The
// message starts with `origin`, which names the document (e.g.
// "config 'ckpt/config.json'"): "<origin> is not valid JSON",
// "<origin> repeats the key 'k'". Text nesting deeper than
// options.max_depth is InvalidArgument (whatever options.error_code says: a
// limit of Mneme, not a corrupt file), checked before parsing: "<origin>
// nests arrays / objects deeper than the limit of 128".
absl::StatusOr<nlohmann::json> ParseJsonDocument(
    absl::string_view text, absl::string_view origin,
    const JsonParseOptions& options = {});

// ParseJsonDocument() keeping the order of object keys (documents that are
// edited and written back, or rendered in their original order).
absl::StatusOr<nlohmann::ordered_json> ParseOrderedJsonDocument(
    absl::string_view text, absl::string_view origin,
    const JsonParseOptions& options = {});

// ---------------------------------------------------------------------------
// Values.

// A JSON integer in [0, 2^64), or nullopt (negative, fractional, a number
// too large for 64 bits - which nlohmann parses as a float - or no number).
std::optional<uint64_t> JsonToUint64(const nlohmann::json& value);

// A JSON integer in [-2^63, 2^63), or nullopt.
std::optional<int64_t> JsonToInt64(const nlohmann::json& value);

// A JSON integer in [min, max], or nullopt.
std::optional<int64_t> JsonToIntInRange(const nlohmann::json& value,
                                        int64_t min, int64_t max);

// A Hugging Face token id (an integer in [0, 2^32)); nullopt otherwise.
std::optional<int64_t> JsonTokenId(const nlohmann::json& value);

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), i.e. whether nlohmann can dump it.
bool IsValidUtf8(absl::string_view text);

// `json` as text; never throws: invalid UTF-8 in strings is replaced by
// U+FFFD. indent < 0 is compact, otherwise pretty-printed with that many
// spaces per level.
template <typename Json>
std::string JsonDump(const Json& json, int indent = -1) {
  return json.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// `value` as compact JSON cut for an error message: at most about
// `max_chars` characters (a longer rendering ends in "..."), arrays and
// objects nested more than 4 levels below `value` shown as [...] / {...}.
// Never throws; time and stack are bounded whatever `value` holds. Use it,
// never dump(), to quote an untrusted value in a message.
std::string JsonSnippet(const nlohmann::json& value, size_t max_chars = 80);
std::string JsonSnippet(const nlohmann::ordered_json& value,
                        size_t max_chars = 80);

// object[key] as T when `object` is an object holding `key` with a value of
// T's kind (an integer that fits T for integral T, any number for floating
// T, a boolean, a string); `fallback` otherwise (absent, null, another kind,
// out of range). For optional settings that have a default.
template <typename T, typename Json>
T JsonFieldOr(const Json& object, absl::string_view key, T fallback) {
  if (!object.is_object()) return fallback;
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : fallback;
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return fallback;
    if constexpr (std::is_unsigned_v<T>) {
      const std::optional<uint64_t> v = JsonToUint64(*it);
      if (!v || *v > std::numeric_limits<T>::max()) return fallback;
      return static_cast<T>(*v);
    } else {
      const std::optional<int64_t> v = JsonToInt64(*it);
      if (!v || *v < std::numeric_limits<T>::min() ||
          *v > std::numeric_limits<T>::max()) {
        return fallback;
      }
      return static_cast<T>(*v);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() ? it->template get<T>() : fallback;
  } else {
    return it->is_string() ? T(it->template get<std::string>()) : fallback;
  }
}

// ---------------------------------------------------------------------------
// Typed field access with errors that name the field.

// Reads the fields of one JSON document. Every error has the code given at
// construction and reads "<origin>: <path>: <what>", where <path> is the
// field's path from the document root: JsonPath(parent, key) joins with a
// dot ("model.vocab"), JsonIndexPath(parent, i) appends "[i]". Pass "" as the
// path of the root.
//
// A JSON null counts as absent. Thread-safe (immutable).
class JsonFieldReader {
 public:
  explicit JsonFieldReader(
      std::string origin,
      absl::StatusCode error_code = absl::StatusCode::kInvalidArgument)
      : origin_(std::move(origin)), error_code_(error_code) {}

  const std::string& origin() const { return origin_; }

  // "<origin>: <path>: <what>" (or "<origin>: <what>" for the root).
  absl::Status Error(absl::string_view path, absl::string_view what) const;

  // object[key], nullptr if absent or null. Error if `object` (at `path`)
  // is not an object.
  absl::StatusOr<const nlohmann::json*> Find(const nlohmann::json& object,
                                             absl::string_view path,
                                             absl::string_view key) const;
  // object[key]; Error "missing" if absent or null.
  absl::StatusOr<const nlohmann::json*> Required(const nlohmann::json& object,
                                                 absl::string_view path,
                                                 absl::string_view key) const;

  // Required fields of one kind; Error "missing" or "not a <kind>".
  absl::StatusOr<std::string> String(const nlohmann::json& object,
                                     absl::string_view path,
                                     absl::string_view key) const;
  absl::StatusOr<bool> Bool(const nlohmann::json& object,
                            absl::string_view path,
                            absl::string_view key) const;
  absl::StatusOr<double> Number(const nlohmann::json& object,
                                absl::string_view path,
                                absl::string_view key) const;
  absl::StatusOr<const nlohmann::json*> Object(const nlohmann::json& object,
                                               absl::string_view path,
                                               absl::string_view key) const;
  absl::StatusOr<const nlohmann::json*> Array(const nlohmann::json& object,
                                              absl::string_view path,
                                              absl::string_view key) const;
  // An integer in [min, max]; Error "not an integer" or "<v> is outside
  // [min, max]".
  absl::StatusOr<int64_t> Int(const nlohmann::json& object,
                              absl::string_view path, absl::string_view key,
                              int64_t min, int64_t max) const;
  // An integer in [0, 2^64).
  absl::StatusOr<uint64_t> Uint(const nlohmann::json& object,
                                absl::string_view path,
                                absl::string_view key) const;
  // An array of integers, each in [min, max]; errors name the element
  // ("<path>.<key>[i]").
  absl::StatusOr<std::vector<int64_t>> IntArray(const nlohmann::json& object,
                                                absl::string_view path,
                                                absl::string_view key,
                                                int64_t min, int64_t max) const;

  // Optional fields: `fallback` when absent or null, Error when present with
  // another kind.
  absl::StatusOr<std::string> StringOr(const nlohmann::json& object,
                                       absl::string_view path,
                                       absl::string_view key,
                                       absl::string_view fallback) const;
  absl::StatusOr<bool> BoolOr(const nlohmann::json& object,
                              absl::string_view path, absl::string_view key,
                              bool fallback) const;

 private:
  std::string origin_;
  absl::StatusCode error_code_;
};

// The path of field `key` of the value at `parent`: "parent.key" (or "key"
// at the root).
std::string JsonPath(absl::string_view parent, absl::string_view key);
// The path of element `index` of the array at `parent`: "parent[index]".
std::string JsonIndexPath(absl::string_view parent, size_t index);

}  // namespace mneme

#endif  // MNEME_COMMON_JSON_H_
