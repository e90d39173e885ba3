#ifndef MNEME_TOOLS_SYNTHETIC_SYNTHETIC_TOKENIZER_H_
#define MNEME_TOOLS_SYNTHETIC_SYNTHETIC_TOKENIZER_H_

#include <cstdint>
#include <string>

namespace mneme::synthetic {

// Special tokens of the synthetic tokenizer (ids as in DeepSeek's family).
inline constexpr int64_t kBosTokenId = 0;
inline constexpr int64_t kEosTokenId = 1;
inline constexpr int64_t kPadTokenId = 2;

// A small Hugging Face tokenizer.json (byte-level BPE as DeepSeek's: special
// added tokens, the 256 byte tokens, then words with their merge chains)
// whose vocabulary exercises every rule of the Engram compressed vocabulary:
// case, accents, full-width forms and ligatures (NFKC), whitespace-only
// tokens, multi-byte characters split across tokens (U+FFFD), CJK, emoji,
// Greek final sigma, code. Deterministic: the same text every call.
std::string SyntheticTokenizerJson();

// The number of tokens of SyntheticTokenizerJson() (model vocab_size).
int64_t SyntheticVocabSize();

}  // namespace mneme::synthetic

#endif  // MNEME_TOOLS_SYNTHETIC_SYNTHETIC_TOKENIZER_H_
