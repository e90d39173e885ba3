#ifndef MNEME_TEXT_PYTHON_JSON_H_
#define MNEME_TEXT_PYTHON_JSON_H_

// JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)`
// writes it, which is how DeepSeek's reference prompt encoder prints tool
// schemas and tool-call arguments into prompts: items separated by ", ",
// keys by ": ", object keys in the order the document gave them, non-ASCII
// characters raw (not \u-escaped), and only '"', '\\' and control characters
// escaped (\n \r \t \b \f by name, the rest as lowercase \u00xx).
//
// Numbers: integers in decimal; floats as Python's repr() (the shortest text
// that reads back as the same double, "1.0", "1e-05", "1e+16"). Integers
// beyond the 64-bit range are read as doubles (Python would keep them exact).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::text {

// Deepest nesting of arrays and objects PythonJsonDumps and
// ParseJsonKeepingKeyOrder accept.
inline constexpr int kMaxPythonJsonDepth = 128;

// Appends `s` as the inside of a JSON string, escaped as Python's json
// module does with ensure_ascii=False (the quote, the backslash, \n \r \t
// \b \f, other control characters as \u00XX, everything else raw); bytes
// that are not UTF-8 become U+FFFD.
void AppendJsonStringContents(absl::string_view s, std::string* out);

// Parses `text` as JSON (strict: no comments, no NaN / Infinity, valid
// UTF-8, nothing after the value but whitespace) keeping the order of object
// keys; a repeated key keeps its first position and its last value, as
// Python's json.loads. InvalidArgument for text that is not JSON or nests
// deeper than kMaxPythonJsonDepth.
absl::StatusOr<nlohmann::ordered_json> ParseJsonKeepingKeyOrder(
    absl::string_view text);

// `value` as Python's json.dumps(value, ensure_ascii=False). InvalidArgument
// for a string that is not valid UTF-8, a non-finite float, a discarded
// value or nesting deeper than kMaxPythonJsonDepth.
absl::StatusOr<std::string> PythonJsonDumps(
    const nlohmann::ordered_json& value);

// ParseJsonKeepingKeyOrder then PythonJsonDumps: JSON text rewritten as
// Python prints it.
absl::StatusOr<std::string> PythonJsonDumpsOfText(absl::string_view json_text);

}  // namespace mneme::text

#endif  // MNEME_TEXT_PYTHON_JSON_H_
