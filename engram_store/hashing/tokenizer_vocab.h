#ifndef MNEME_ENGRAM_STORE_HASHING_TOKENIZER_VOCAB_H_
#define MNEME_ENGRAM_STORE_HASHING_TOKENIZER_VOCAB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::engram {

// tokenizer_config.json's `clean_up_tokenization_spaces`: whether
// transformers' decode() removes the space before . ? ! , ' n't 'm 's 've 're.
enum class CleanUpTokenizationSpaces {
  kNo = 0,
  kYes = 1,
};

// The id -> token-string side of a Hugging Face tokenizer.json with a
// byte-level BPE model: enough to reproduce, for a single token id,
// `tokenizer.convert_ids_to_tokens(id)` and
// `tokenizer.decode([id], skip_special_tokens=False)` of transformers' fast
// tokenizer. Immutable after Create(); thread-safe.
class TokenizerVocab {
 public:
  // Reads and parses a tokenizer.json. NotFound / PermissionDenied if the
  // file cannot be read; DataLoss naming the file for malformed content
  // (invalid JSON, no model.vocab object, a token id that is not an integer
  // in [0, 2^32), two vocab tokens with one id, an added token without an
  // integer id or string content); InvalidArgument naming the file for a
  // model other than BPE or a decoder other than ByteLevel (alone or as the
  // only member of a Sequence) or none.
  // Added tokens get the ids Hugging Face gives them when it loads the file
  // (the file's "id" is only checked there): the id of a vocab token or
  // earlier added token with the same content, else the next id after the
  // vocabulary size and every added id so far. Empty ones are ignored.
  static absl::StatusOr<std::unique_ptr<TokenizerVocab>> Create(
      const std::string& tokenizer_json_path);
  // As Create() for the file's text; `source_name` names it in errors.
  static absl::StatusOr<std::unique_ptr<TokenizerVocab>> FromJson(
      absl::string_view json_text, absl::string_view source_name);

  // len(tokenizer): the number of distinct token strings of model.vocab and
  // added_tokens together. The reference builds its table for ids
  // [0, size()).
  int64_t size() const { return size_; }

  // convert_ids_to_tokens(id): the added token's content if `id` is an added
  // token, else the model vocabulary's string (byte-level spelling, e.g.
  // "Ġhello"); nullopt for an id without a token.
  std::optional<absl::string_view> TokenString(int64_t id) const;

  // decode([id], skip_special_tokens=False): the token's bytes through the
  // decoder (ByteLevel: see ByteLevelTokenBytes()), made valid UTF-8 as
  // Rust's from_utf8_lossy (U+FFFD for partial characters), then
  // transformers' clean-up if asked. "" for an id without a token.
  std::string Decode(int64_t id, CleanUpTokenizationSpaces clean_up) const;

 private:
  enum class Decoder { kNone, kByteLevel };

  TokenizerVocab() = default;

  absl::flat_hash_map<int64_t, std::string> tokens_;
  int64_t size_ = 0;
  Decoder decoder_ = Decoder::kNone;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_TOKENIZER_VOCAB_H_
