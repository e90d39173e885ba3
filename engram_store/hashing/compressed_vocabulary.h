#ifndef MNEME_ENGRAM_STORE_HASHING_COMPRESSED_VOCABULARY_H_
#define MNEME_ENGRAM_STORE_HASHING_COMPRESSED_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engram_store/hashing/tokenizer_vocab.h"

namespace mneme::engram {

struct CompressedVocabularyOptions {
  // Path of the checkpoint's tokenizer.json (Hugging Face format, byte-level
  // BPE). Required.
  std::string tokenizer_json_path;
  // tokenizer_config.json's clean_up_tokenization_spaces, which changes what
  // decode() returns. Default: kNo (DeepSeek's tokenizers set it false).
  CleanUpTokenizationSpaces clean_up_tokenization_spaces =
      CleanUpTokenizationSpaces::kNo;
};

// The key the reference compressed tokenizer groups token `id` under
// (ENGRAM.md, "Row id computation" 1): text = decode([id]); if text contains
// U+FFFD, the raw token string (convert_ids_to_tokens); else
// NormalizeTokenText(text), or text itself when that is empty.
// Internal if normalization fails.
absl::StatusOr<std::string> CompressionKey(const TokenizerVocab& tokenizer,
                                           int64_t id,
                                           CleanUpTokenizationSpaces clean_up);

// The map from token ids to compressed ids: tokens whose keys are equal share
// one compressed id; ids are numbered by first occurrence in token-id order.
// Immutable after creation; thread-safe.
class CompressedVocabulary {
 public:
  // Builds the map from a tokenizer.json: errors of TokenizerVocab::Create()
  // (NotFound, DataLoss, InvalidArgument), Internal if normalization fails.
  static absl::StatusOr<std::unique_ptr<CompressedVocabulary>> Create(
      const CompressedVocabularyOptions& options);
  // Builds the map for ids [0, tokenizer.size()) of a parsed tokenizer.
  static absl::StatusOr<std::unique_ptr<CompressedVocabulary>> FromTokenizer(
      const TokenizerVocab& tokenizer, CleanUpTokenizationSpaces clean_up);
  // Wraps an existing table (token id -> compressed id), e.g. for synthetic
  // models. InvalidArgument unless the table is non-empty and its ids are
  // numbered by first occurrence (0 first, each new id one above the largest
  // so far).
  static absl::StatusOr<std::unique_ptr<CompressedVocabulary>> FromLookupTable(
      std::vector<int64_t> token_to_compressed);

  // The number of compressed ids (the reference's len(compressed_tokenizer)).
  int64_t size() const { return size_; }
  // Token ids covered: [0, num_tokens()).
  int64_t num_tokens() const { return static_cast<int64_t>(lookup_.size()); }
  // token id -> compressed id, indexed by token id.
  const std::vector<int64_t>& lookup_table() const { return lookup_; }

  // The compressed id of `token_id`; OutOfRange naming it when it is not in
  // [0, num_tokens()).
  absl::StatusOr<int64_t> Lookup(int64_t token_id) const;

  // OK if size() == expected (config.json's engram_compressed_vocab_size);
  // else InvalidArgument naming both numbers: every multiplier depends on
  // the size, so a mismatch means a tokenizer of another model.
  absl::Status CheckSize(int64_t expected) const;

 private:
  CompressedVocabulary(std::vector<int64_t> lookup, int64_t size)
      : lookup_(std::move(lookup)), size_(size) {}

  std::vector<int64_t> lookup_;
  int64_t size_ = 0;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_COMPRESSED_VOCABULARY_H_
