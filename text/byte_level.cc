#include "text/byte_level.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace mneme::text {
namespace {

constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";

constexpr bool StandsForItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
         (b >= 0xAE && b <= 0xFF);
}

constexpr std::array<char32_t, 256> BuildByteToChar() {
  std::array<char32_t, 256> table{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    table[b] = StandsForItself(b) ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

constexpr std::array<char32_t, 256> kByteToChar = BuildByteToChar();

// Every alphabet code point is below U+0144 (0x100 + 68 remapped bytes).
constexpr char32_t kAlphabetEnd = 0x144;

constexpr std::array<int16_t, kAlphabetEnd> BuildCharToByte() {
  std::array<int16_t, kAlphabetEnd> table{};
  for (int16_t& entry : table) entry = -1;
  for (int b = 0; b < 256; ++b) table[kByteToChar[b]] = static_cast<int16_t>(b);
  return table;
}

constexpr std::array<int16_t, kAlphabetEnd> kCharToByte = BuildCharToByte();

// Length of the well-formed UTF-8 sequence at the start of `s`, or the length
// of the maximal subpart of an ill-formed one as a negative number (at least
// one byte). Follows the Unicode table of well-formed byte sequences.
int NextSequence(absl::string_view s, size_t pos, char32_t* code_point) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const size_t left = s.size() - pos;
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  int length;
  uint8_t lo = 0x80, hi = 0xBF;  // Allowed range of the second byte.
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  char32_t value = b0 & (0xFF >> (length + 1));
  for (int i = 1; i < length; ++i) {
    if (static_cast<size_t>(i) >= left) return -i;
    const uint8_t b = byte(i);
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return -i;
    value = (value << 6) | (b & 0x3F);
  }
  *code_point = value;
  return length;
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

char32_t ByteLevelCharOfByte(uint8_t byte) { return kByteToChar[byte]; }

std::optional<uint8_t> ByteOfByteLevelChar(char32_t c) {
  if (c >= kAlphabetEnd || kCharToByte[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(kCharToByte[c]);
}

std::string ByteLevelTokenBytes(absl::string_view token) {
  std::optional<std::u32string> chars = DecodeUtf8(token);
  if (!chars.has_value()) return std::string(token);
  std::string bytes;
  bytes.reserve(chars->size());
  for (char32_t c : *chars) {
    std::optional<uint8_t> byte = ByteOfByteLevelChar(c);
    if (!byte.has_value()) return std::string(token);
    bytes.push_back(static_cast<char>(*byte));
  }
  return bytes;
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    char32_t c;
    const int n = NextSequence(bytes, pos, &c);
    if (n > 0) {
      out.append(bytes.data() + pos, static_cast<size_t>(n));
      pos += n;
    } else {
      out.append(kReplacementUtf8);
      pos += -n;
    }
  }
  return out;
}

std::optional<std::u32string> DecodeUtf8(absl::string_view utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  size_t pos = 0;
  while (pos < utf8.size()) {
    char32_t c;
    const int n = NextSequence(utf8, pos, &c);
    if (n < 0) return std::nullopt;
    out.push_back(c);
    pos += n;
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) AppendUtf8(c, out);
  return out;
}

}  // namespace mneme::text
