#ifndef MNEME_TEXT_BYTE_LEVEL_H_
#define MNEME_TEXT_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace mneme::text {

// Byte-level BPE (GPT-2 `bytes_to_unicode`, Hugging Face `ByteLevel`): token
// strings spell each byte as one printable code point. Bytes '!'..'~',
// 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68 bytes map, in
// increasing order, to U+0100.. (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ'
// U+010A).

// The code point that spells `byte` in a byte-level token string.
char32_t ByteLevelCharOfByte(uint8_t byte);
// The byte a code point of the byte-level alphabet spells, or nullopt for a
// code point outside the alphabet.
std::optional<uint8_t> ByteOfByteLevelChar(char32_t c);

// The bytes of one token as the Hugging Face ByteLevel decoder produces
// them: if every character of the (UTF-8) `token` is in the byte-level
// alphabet, the bytes they spell; otherwise the token's own UTF-8 bytes
// (how added tokens such as "<｜begin▁of▁sentence｜>" come out verbatim).
// The result need not be valid UTF-8 (a token may hold part of a character).
std::string ByteLevelTokenBytes(absl::string_view token);

// `bytes` as Rust's String::from_utf8_lossy makes it valid UTF-8: each
// maximal prefix of an ill-formed subsequence (Unicode "substitution of
// maximal subparts") becomes one U+FFFD.
std::string Utf8Lossy(absl::string_view bytes);

// Decodes well-formed UTF-8 into code points; nullopt if `utf8` is not
// well-formed.
std::optional<std::u32string> DecodeUtf8(absl::string_view utf8);
// Encodes code points as UTF-8 (code points must be valid scalar values).
std::string EncodeUtf8(std::u32string_view text);

}  // namespace mneme::text

#endif  // MNEME_TEXT_BYTE_LEVEL_H_
