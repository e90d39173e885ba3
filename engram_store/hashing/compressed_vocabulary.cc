#include "engram_store/hashing/compressed_vocabulary.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engram_store/hashing/token_normalizer.h"
#include "engram_store/hashing/tokenizer_vocab.h"

namespace mneme::engram {
namespace {

constexpr char kReplacementCharacter[] = "\xEF\xBF\xBD";

}  // namespace

absl::StatusOr<std::string> CompressionKey(const TokenizerVocab& tokenizer,
                                           int64_t id,
                                           CleanUpTokenizationSpaces clean_up) {
  std::string text = tokenizer.Decode(id, clean_up);
  if (text.find(kReplacementCharacter) != std::string::npos) {
    // A partial UTF-8 character: the normalized text would merge unrelated
    // byte fragments, so the raw token spelling is the key. Ids always have a
    // token here: an id without one decodes to "".
    return std::string(tokenizer.TokenString(id).value_or(""));
  }
  absl::StatusOr<std::string> normalized = NormalizeTokenText(text);
  if (!normalized.ok()) {
    return absl::InternalError(absl::StrCat("normalizing token ", id, ": ",
                                            normalized.status().message()));
  }
  if (normalized->empty()) return text;
  return *std::move(normalized);
}

absl::StatusOr<std::unique_ptr<CompressedVocabulary>>
CompressedVocabulary::Create(const CompressedVocabularyOptions& options) {
  if (options.tokenizer_json_path.empty()) {
    return absl::InvalidArgumentError(
        "CompressedVocabularyOptions.tokenizer_json_path is empty");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TokenizerVocab> tokenizer,
                   TokenizerVocab::Create(options.tokenizer_json_path));
  return FromTokenizer(*tokenizer, options.clean_up_tokenization_spaces);
}

absl::StatusOr<std::unique_ptr<CompressedVocabulary>>
CompressedVocabulary::FromTokenizer(const TokenizerVocab& tokenizer,
                                    CleanUpTokenizationSpaces clean_up) {
  std::vector<int64_t> lookup(static_cast<size_t>(tokenizer.size()));
  absl::flat_hash_map<std::string, int64_t> key_to_id;
  for (int64_t id = 0; id < tokenizer.size(); ++id) {
    ASSIGN_OR_RETURN(std::string key, CompressionKey(tokenizer, id, clean_up));
    const auto [it, inserted] = key_to_id.try_emplace(
        std::move(key), static_cast<int64_t>(key_to_id.size()));
    lookup[id] = it->second;
  }
  const auto size = static_cast<int64_t>(key_to_id.size());
  return std::unique_ptr<CompressedVocabulary>(
      new CompressedVocabulary(std::move(lookup), size));
}

absl::StatusOr<std::unique_ptr<CompressedVocabulary>>
CompressedVocabulary::FromLookupTable(
    std::vector<int64_t> token_to_compressed) {
  if (token_to_compressed.empty()) {
    return absl::InvalidArgumentError("compressed lookup table is empty");
  }
  int64_t size = 0;
  for (size_t token = 0; token < token_to_compressed.size(); ++token) {
    const int64_t id = token_to_compressed[token];
    if (id < 0 || id > size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compressed lookup table: token ", token, " maps to ", id,
          "; ids must be numbered by first occurrence (next new id: ", size,
          ")"));
    }
    if (id == size) ++size;
  }
  return std::unique_ptr<CompressedVocabulary>(
      new CompressedVocabulary(std::move(token_to_compressed), size));
}

absl::StatusOr<int64_t> CompressedVocabulary::Lookup(int64_t token_id) const {
  if (token_id < 0 || token_id >= num_tokens()) {
    return absl::OutOfRangeError(
        absl::StrCat("token id ", token_id,
                     " is outside the compressed vocabulary's token ids [0, ",
                     num_tokens(), ")"));
  }
  return lookup_[static_cast<size_t>(token_id)];
}

absl::Status CompressedVocabulary::CheckSize(int64_t expected) const {
  if (size_ == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("compressed vocabulary size mismatch: config "
                   "engram_compressed_vocab_size expects ",
                   expected, " ids, the tokenizer gives ", size_));
}

}  // namespace mneme::engram
