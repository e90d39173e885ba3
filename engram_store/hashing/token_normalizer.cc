#include "engram_store/hashing/token_normalizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "text/byte_level.h"

namespace mneme::engram {
namespace {

constexpr char32_t kSentinel = 0xE000;

bool IsMark(UChar32 c) { return (U_GET_GC_MASK(c) & U_GC_M_MASK) != 0; }

bool IsCollapsibleSpace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

absl::Status IcuError(const char* what, UErrorCode code) {
  return absl::InternalError(
      absl::StrCat("ICU ", what, " failed: ", u_errorName(code)));
}

}  // namespace

absl::StatusOr<std::string> NormalizeTokenText(absl::string_view utf8_text) {
  if (!text::DecodeUtf8(utf8_text).has_value()) {
    return absl::InvalidArgumentError("token text is not well-formed UTF-8");
  }
  UErrorCode code = U_ZERO_ERROR;
  const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(code);
  if (U_FAILURE(code)) return IcuError("NFKC instance", code);
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(code);
  if (U_FAILURE(code)) return IcuError("NFD instance", code);

  const icu::UnicodeString input =
      icu::UnicodeString::fromUTF8(icu::StringPiece(
          utf8_text.data(), static_cast<int32_t>(utf8_text.size())));
  const icu::UnicodeString composed = nfkc->normalize(input, code);
  if (U_FAILURE(code)) return IcuError("NFKC", code);
  const icu::UnicodeString decomposed = nfd->normalize(composed, code);
  if (U_FAILURE(code)) return IcuError("NFD", code);

  // Strip marks and lowercase, one code point at a time.
  std::u32string lowered;
  lowered.reserve(decomposed.length());
  for (int32_t i = 0; i < decomposed.length();) {
    const UChar32 c = decomposed.char32At(i);
    i += U16_LENGTH(c);
    if (IsMark(c)) continue;
    // A one-code-point string has no casing context, which gives Rust's
    // context-free char::to_lowercase (ICU's root locale applies no
    // language rules).
    icu::UnicodeString one(c);
    one.toLower(icu::Locale::getRoot());
    for (int32_t k = 0; k < one.length();) {
      const UChar32 lower = one.char32At(k);
      k += U16_LENGTH(lower);
      lowered.push_back(static_cast<char32_t>(lower));
    }
  }

  std::u32string collapsed;
  collapsed.reserve(lowered.size());
  for (size_t i = 0; i < lowered.size();) {
    if (IsCollapsibleSpace(lowered[i])) {
      collapsed.push_back(U' ');
      while (i < lowered.size() && IsCollapsibleSpace(lowered[i])) ++i;
    } else {
      collapsed.push_back(lowered[i++]);
    }
  }
  if (collapsed == U" ") collapsed = std::u32string(1, kSentinel);

  size_t begin = 0;
  size_t end = collapsed.size();
  while (begin < end &&
         u_isUWhiteSpace(static_cast<UChar32>(collapsed[begin]))) {
    ++begin;
  }
  while (end > begin &&
         u_isUWhiteSpace(static_cast<UChar32>(collapsed[end - 1]))) {
    --end;
  }
  std::u32string stripped = collapsed.substr(begin, end - begin);
  for (char32_t& c : stripped) {
    if (c == kSentinel) c = U' ';
  }
  return text::EncodeUtf8(stripped);
}

}  // namespace mneme::engram
