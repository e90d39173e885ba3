#include "text/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_json.h"
#include "text/unicode_regex.h"
#include "text/utf8.h"

namespace mneme::text {

struct Normalizer::Step {
  enum class Kind { kUnicode, kLowercase, kReplace, kPrepend, kStrip };
  Kind kind = Kind::kUnicode;
  // kUnicode: the ICU normalization (owned by ICU).
  const icu::Normalizer2* unicode = nullptr;
  // kReplace: the literal pattern (when `regex` is null) and content;
  // kPrepend: the prefix in `content`.
  std::string literal;
  std::unique_ptr<UnicodeRegex> regex;
  std::string content;
  // kStrip.
  bool strip_left = false;
  bool strip_right = false;
};

Normalizer::Normalizer() = default;
Normalizer::~Normalizer() = default;

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(
    const nlohmann::json& spec) {
  auto normalizer = std::unique_ptr<Normalizer>(new Normalizer());
  if (spec.is_null()) return normalizer;
  RETURN_IF_ERROR(normalizer->AddSteps(spec, /*depth=*/0));
  return normalizer;
}

absl::Status Normalizer::AddSteps(const nlohmann::json& spec, int depth) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(spec, "normalizer"));
  ASSIGN_OR_RETURN(
      bool sequence,
      ExpandSequence(spec, type, "normalizers", "normalizer", depth,
                     [this](const nlohmann::json& member, int member_depth) {
                       return AddSteps(member, member_depth);
                     }));
  if (sequence) return absl::OkStatus();
  Step step;
  UErrorCode icu_status = U_ZERO_ERROR;
  if (type == "NFC") {
    step.unicode = icu::Normalizer2::getNFCInstance(icu_status);
  } else if (type == "NFD") {
    step.unicode = icu::Normalizer2::getNFDInstance(icu_status);
  } else if (type == "NFKC") {
    step.unicode = icu::Normalizer2::getNFKCInstance(icu_status);
  } else if (type == "NFKD") {
    step.unicode = icu::Normalizer2::getNFKDInstance(icu_status);
  } else if (type == "Lowercase") {
    step.kind = Step::Kind::kLowercase;
  } else if (type == "Replace") {
    step.kind = Step::Kind::kReplace;
    ASSIGN_OR_RETURN(Pattern pattern, PatternOf(spec, "normalizer Replace"));
    if (pattern.is_regex) {
      absl::StatusOr<std::unique_ptr<UnicodeRegex>> regex =
          UnicodeRegex::Create(pattern.text);
      if (!regex.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("normalizer Replace: ", regex.status().message()));
      }
      step.regex = *std::move(regex);
    } else {
      step.literal = pattern.text;
    }
    ASSIGN_OR_RETURN(std::string content,
                     StringField(spec, "content", "normalizer Replace"));
    step.content = std::move(content);
  } else if (type == "Prepend") {
    step.kind = Step::Kind::kPrepend;
    ASSIGN_OR_RETURN(std::string prepend,
                     StringField(spec, "prepend", "normalizer Prepend"));
    step.content = std::move(prepend);
  } else if (type == "Strip") {
    step.kind = Step::Kind::kStrip;
    ASSIGN_OR_RETURN(step.strip_left,
                     BoolField(spec, "strip_left", true, "normalizer Strip"));
    ASSIGN_OR_RETURN(step.strip_right,
                     BoolField(spec, "strip_right", true, "normalizer Strip"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported normalizer type \"", type,
        "\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, "
        "Strip, Sequence)"));
  }
  if (U_FAILURE(icu_status)) {
    return absl::InternalError(absl::StrCat("ICU normalizer for ", type, ": ",
                                            u_errorName(icu_status)));
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

namespace {

// Rust's char::to_lowercase (the full, context-free lowercase mapping) of
// every code point: ICU's full mapping applied to one code point at a time.
std::string Lowercase(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  int32_t i = 0;
  while (i < length) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      continue;
    }
    if (!u_hasBinaryProperty(c, UCHAR_CHANGES_WHEN_LOWERCASED)) {
      out.append(text.data() + start, static_cast<size_t>(i - start));
      continue;
    }
    icu::UnicodeString one(c);
    one.toLower(icu::Locale::getRoot());
    one.toUTF8String(out);
  }
  return out;
}

std::string ReplaceLiteral(absl::string_view text, absl::string_view from,
                           absl::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == absl::string_view::npos) break;
    out.append(text.data() + pos, hit - pos);
    out.append(to.data(), to.size());
    pos = hit + from.size();
  }
  out.append(text.data() + pos, text.size() - pos);
  return out;
}

}  // namespace

absl::StatusOr<std::string> Normalizer::Normalize(
    absl::string_view text) const {
  std::string current(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kUnicode: {
        std::string out;
        icu::StringByteSink<std::string> sink(
            &out, static_cast<int32_t>(current.size()));
        UErrorCode status = U_ZERO_ERROR;
        step.unicode->normalizeUTF8(
            0,
            icu::StringPiece(current.data(),
                             static_cast<int32_t>(current.size())),
            sink, nullptr, status);
        if (U_FAILURE(status)) {
          return absl::InternalError(
              absl::StrCat("ICU normalization failed: ", u_errorName(status)));
        }
        current = std::move(out);
        break;
      }
      case Step::Kind::kLowercase:
        current = Lowercase(current);
        break;
      case Step::Kind::kReplace: {
        if (step.regex == nullptr) {
          current = ReplaceLiteral(current, step.literal, step.content);
          break;
        }
        ASSIGN_OR_RETURN(std::vector<ByteRange> matches,
                         step.regex->FindAll(current));
        std::string out;
        size_t pos = 0;
        for (const ByteRange& match : matches) {
          out.append(current, pos, match.begin - pos);
          out.append(step.content);
          pos = match.end;
        }
        out.append(current, pos, std::string::npos);
        current = std::move(out);
        break;
      }
      case Step::Kind::kPrepend:
        if (!current.empty()) current.insert(0, step.content);
        break;
      case Step::Kind::kStrip: {
        size_t begin = 0;
        size_t end = current.size();
        if (step.strip_left) begin = LeadingWhitespaceBytes(current);
        if (step.strip_right && begin < end) {
          end -=
              TrailingWhitespaceBytes(absl::string_view(current).substr(begin));
        }
        current = current.substr(begin, end - begin);
        break;
      }
    }
  }
  return current;
}

}  // namespace mneme::text
