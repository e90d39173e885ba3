#ifndef MNEME_TEXT_UTF8_H_
#define MNEME_TEXT_UTF8_H_

#include <cstddef>

#include "absl/strings/string_view.h"

// Small UTF-8 and Unicode-property helpers with the semantics of the Rust
// functions Hugging Face tokenizers relies on.
namespace mneme::text {

// True if `text` is well-formed UTF-8 (no surrogates, no overlong forms).
bool IsWellFormedUtf8(absl::string_view text);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool IsWhitespace(char32_t c);

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector
// punctuation and Join_Control.
bool IsWordChar(char32_t c);

// Bytes of the whitespace characters at the start / end of well-formed
// `text`.
size_t LeadingWhitespaceBytes(absl::string_view text);
size_t TrailingWhitespaceBytes(absl::string_view text);

// The first / last code point of well-formed, non-empty `text`.
char32_t FirstChar(absl::string_view text);
char32_t LastChar(absl::string_view text);

// The length of the longest prefix of `bytes` that does not end inside an
// incomplete UTF-8 sequence: `bytes` minus a trailing 1-3 byte sequence that
// is a valid start of a character whose remaining bytes have not arrived.
// Bytes that can never become well-formed are not held back (they decode as
// U+FFFD whatever follows).
size_t CompleteUtf8PrefixLength(absl::string_view bytes);

}  // namespace mneme::text

#endif  // MNEME_TEXT_UTF8_H_
