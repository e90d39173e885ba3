#include "text/utf8.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace mneme::text {

bool IsWellFormedUtf8(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  int32_t i = 0;
  while (i < length) {
    if (bytes[i] < 0x80) {
      ++i;
      continue;
    }
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    if (c < 0) return false;
  }
  return true;
}

bool IsWhitespace(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool IsWordChar(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  return u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) ||
         (U_GET_GC_MASK(cp) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) !=
             0 ||
         u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL);
}

size_t LeadingWhitespaceBytes(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  int32_t i = 0;
  while (i < length) {
    const int32_t start = i;
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    if (c < 0 || !IsWhitespace(static_cast<char32_t>(c))) {
      return static_cast<size_t>(start);
    }
  }
  return text.size();
}

size_t TrailingWhitespaceBytes(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  int32_t i = static_cast<int32_t>(text.size());
  while (i > 0) {
    const int32_t end = i;
    UChar32 c;
    U8_PREV(bytes, 0, i, c);
    if (c < 0 || !IsWhitespace(static_cast<char32_t>(c))) {
      return text.size() - static_cast<size_t>(end);
    }
  }
  return text.size();
}

char32_t FirstChar(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  int32_t i = 0;
  UChar32 c;
  U8_NEXT(bytes, i, static_cast<int32_t>(text.size()), c);
  return static_cast<char32_t>(c < 0 ? 0xFFFD : c);
}

char32_t LastChar(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  int32_t i = static_cast<int32_t>(text.size());
  UChar32 c;
  U8_PREV(bytes, 0, i, c);
  return static_cast<char32_t>(c < 0 ? 0xFFFD : c);
}

size_t CompleteUtf8PrefixLength(absl::string_view bytes) {
  // A held-back tail is at most 3 bytes: a lead byte and up to two
  // continuation bytes, each allowed where it stands (the second byte's range
  // depends on the lead byte, as in the Unicode table of well-formed
  // sequences).
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto lead = static_cast<uint8_t>(bytes[n - back]);
    if (lead < 0x80) return n;            // ASCII: nothing incomplete after it.
    if ((lead & 0xC0) == 0x80) continue;  // Continuation: look further back.
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      need = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      need = 3;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      need = 4;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    } else {
      return n;  // Never a lead byte.
    }
    if (back >= need) return n;  // Complete (or over-long run): not held.
    for (size_t k = 1; k < back; ++k) {
      const auto b = static_cast<uint8_t>(bytes[n - back + k]);
      const uint8_t min = k == 1 ? lo : 0x80;
      const uint8_t max = k == 1 ? hi : 0xBF;
      if (b < min || b > max) return n;  // Ill-formed already.
    }
    return n - back;
  }
  return n;
}

}  // namespace mneme::text
