#ifndef MNEME_ENGRAM_STORE_HASHING_TOKEN_NORMALIZER_H_
#define MNEME_ENGRAM_STORE_HASHING_TOKEN_NORMALIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::engram {

// Normalizes a token's decoded text the way the reference compressed
// tokenizer's Hugging Face normalizer sequence does (ENGRAM.md, "Row id
// computation" 1), in this order:
//   1. NFKC, then NFD (ICU);
//   2. StripAccents: drop every mark (General_Category M: Mn, Mc and Me, as
//      Hugging Face's is_combining_mark);
//   3. Lowercase: each code point by its full lowercase mapping without
//      context, as Rust's char::to_lowercase ('Σ' -> 'σ' even at a word end,
//      'İ' -> "i̇");
//   4. each run of [ \t\r\n]+ -> one ' ';
//   5. a text that is now exactly " " is protected by the sentinel U+E000;
//   6. strip leading and trailing White_Space (Rust's char::is_whitespace);
//   7. every U+E000 -> ' ' (also one that was in the token itself).
// The result may be empty; the caller then keys the token by its text.
// Thread-safe. InvalidArgument if `utf8_text` is not well-formed UTF-8;
// Internal if ICU fails.
absl::StatusOr<std::string> NormalizeTokenText(absl::string_view utf8_text);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_TOKEN_NORMALIZER_H_
