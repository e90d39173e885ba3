#ifndef MNEME_TESTS_ENGRAM_STORE_HASHING_TEST_TOKENIZER_H_
#define MNEME_TESTS_ENGRAM_STORE_HASHING_TEST_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mneme::engram::testing {

// The byte-level BPE spelling of raw bytes (GPT-2's bytes_to_unicode),
// implemented independently of engram_store/hashing.
std::string ByteLevelSpelling(absl::string_view bytes);

struct AddedToken {
  int64_t id;
  std::string content;
  bool special;
};

// A tokenizer.json (Hugging Face format) with a byte-level BPE model whose
// vocabulary is `vocab` (token strings as stored, e.g. ByteLevelSpelling(" a")
// or a special token's raw text; entry i gets id vocab_ids[i], or i when
// vocab_ids is empty), the given added tokens (in file order) and a
// ByteLevel decoder.
std::string MakeTokenizerJson(const std::vector<std::string>& vocab,
                              const std::vector<AddedToken>& added,
                              const std::vector<int64_t>& vocab_ids = {});

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_HASHING_TEST_TOKENIZER_H_
