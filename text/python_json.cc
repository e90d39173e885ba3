#include "text/python_json.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/utf8.h"

namespace mneme::text {
namespace {

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The length of the valid UTF-8 sequence at s[i], or 0.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  size_t len = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if (b1 < lo || b1 > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (!IsContinuation(static_cast<unsigned char>(s[i + k]))) return 0;
  }
  return len;
}

}  // namespace

void AppendJsonStringContents(absl::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out->append("\\\"");
          break;
        case '\\':
          out->append("\\\\");
          break;
        case '\n':
          out->append("\\n");
          break;
        case '\r':
          out->append("\\r");
          break;
        case '\t':
          out->append("\\t");
          break;
        case '\b':
          out->append("\\b");
          break;
        case '\f':
          out->append("\\f");
          break;
        default:
          if (c < 0x20) {
            absl::StrAppendFormat(out, "\\u%04x", c);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    const size_t len = Utf8SequenceLength(s, i);
    if (len == 0) {
      out->append("\xEF\xBF\xBD");
      ++i;
    } else {
      absl::StrAppend(out, s.substr(i, len));
      i += len;
    }
  }
}

namespace {

using ordered_json = nlohmann::ordered_json;

// Python's json encoder with ensure_ascii=False (py_encode_basestring).
void AppendString(absl::string_view s, std::string* out) {
  out->push_back('"');
  AppendJsonStringContents(s, out);
  out->push_back('"');
}

// Python's repr() of a finite double: the shortest digits that read back as
// the same value, written in positional notation when the decimal exponent
// is in [-4, 16), else as d.ddde+XX (at least two exponent digits).
void AppendPythonFloat(double v, std::string* out) {
  std::array<char, 64> buf{};
  const std::to_chars_result r = std::to_chars(
      buf.data(), buf.data() + buf.size(), v, std::chars_format::scientific);
  // "-d.ddde+XX": sign, digits (without the point), exponent.
  const absl::string_view text(buf.data(), r.ptr - buf.data());
  size_t i = 0;
  if (text[i] == '-') {
    out->push_back('-');
    ++i;
  }
  std::string digits;
  for (; i < text.size() && text[i] != 'e'; ++i) {
    if (text[i] != '.') digits.push_back(text[i]);
  }
  int exponent = 0;
  if (i < text.size()) {
    ++i;  // 'e'
    const bool negative = text[i] == '-';
    ++i;  // sign
    for (; i < text.size(); ++i) exponent = exponent * 10 + (text[i] - '0');
    if (negative) exponent = -exponent;
  }
  // The decimal point follows `point` digits.
  const int point = exponent + 1;
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out->append("0.");
      out->append(static_cast<size_t>(-point), '0');
      out->append(digits);
    } else if (point >= n) {
      out->append(digits);
      out->append(static_cast<size_t>(point - n), '0');
      out->append(".0");
    } else {
      out->append(digits, 0, point);
      out->push_back('.');
      out->append(digits, point);
    }
    return;
  }
  out->push_back(digits[0]);
  if (n > 1) {
    out->push_back('.');
    out->append(digits, 1);
  }
  const int abs_exponent = exponent < 0 ? -exponent : exponent;
  absl::StrAppend(out, exponent < 0 ? "e-" : "e+", abs_exponent < 10 ? "0" : "",
                  abs_exponent);
}

absl::Status Append(const ordered_json& value, int depth, std::string* out) {
  switch (value.type()) {
    case ordered_json::value_t::null:
      out->append("null");
      return absl::OkStatus();
    case ordered_json::value_t::boolean:
      out->append(value.get<bool>() ? "true" : "false");
      return absl::OkStatus();
    case ordered_json::value_t::number_integer:
      absl::StrAppend(out, value.get<int64_t>());
      return absl::OkStatus();
    case ordered_json::value_t::number_unsigned:
      absl::StrAppend(out, value.get<uint64_t>());
      return absl::OkStatus();
    case ordered_json::value_t::number_float: {
      if (!std::isfinite(value.get<double>())) {
        return absl::InvalidArgumentError(
            "JSON has no text for a non-finite number");
      }
      AppendPythonFloat(value.get<double>(), out);
      return absl::OkStatus();
    }
    case ordered_json::value_t::string: {
      const auto& s = value.get_ref<const std::string&>();
      if (!IsWellFormedUtf8(s)) {
        return absl::InvalidArgumentError("a JSON string is not valid UTF-8");
      }
      AppendString(s, out);
      return absl::OkStatus();
    }
    case ordered_json::value_t::array: {
      if (depth >= kMaxPythonJsonDepth) break;
      out->push_back('[');
      bool first = true;
      for (const ordered_json& item : value) {
        if (!first) out->append(", ");
        first = false;
        RETURN_IF_ERROR(Append(item, depth + 1, out));
      }
      out->push_back(']');
      return absl::OkStatus();
    }
    case ordered_json::value_t::object: {
      if (depth >= kMaxPythonJsonDepth) break;
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out->append(", ");
        first = false;
        if (!IsWellFormedUtf8(key)) {
          return absl::InvalidArgumentError(
              "a JSON object key is not valid UTF-8");
        }
        AppendString(key, out);
        out->append(": ");
        RETURN_IF_ERROR(Append(item, depth + 1, out));
      }
      out->push_back('}');
      return absl::OkStatus();
    }
    case ordered_json::value_t::binary:
    case ordered_json::value_t::discarded:
      return absl::InvalidArgumentError("not a JSON value");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "JSON nests deeper than ", kMaxPythonJsonDepth, " arrays / objects"));
}

}  // namespace

absl::StatusOr<nlohmann::ordered_json> ParseJsonKeepingKeyOrder(
    absl::string_view text) {
  // nlohmann stops at a NUL byte as if the input ended there.
  if (text.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("not valid JSON (a NUL byte)");
  }
  if (JsonNestingDepth(text) > kMaxPythonJsonDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "JSON nests deeper than ", kMaxPythonJsonDepth, " arrays / objects"));
  }
  ordered_json value = ordered_json::parse(text.begin(), text.end(),
                                           /*cb=*/nullptr,
                                           /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError("not valid JSON");
  }
  return value;
}

absl::StatusOr<std::string> PythonJsonDumps(
    const nlohmann::ordered_json& value) {
  std::string out;
  RETURN_IF_ERROR(Append(value, 0, &out));
  return out;
}

absl::StatusOr<std::string> PythonJsonDumpsOfText(absl::string_view json_text) {
  ASSIGN_OR_RETURN(const nlohmann::ordered_json value,
                   ParseJsonKeepingKeyOrder(json_text));
  return PythonJsonDumps(value);
}

}  // namespace mneme::text
