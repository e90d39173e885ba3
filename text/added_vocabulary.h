#ifndef MNEME_TEXT_ADDED_VOCABULARY_H_
#define MNEME_TEXT_ADDED_VOCABULARY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::text {

class BpeModel;
class Normalizer;

// One entry of a tokenizer.json's "added_tokens".
struct AddedToken {
  std::string content;
  // What the id stands for when decoded: `content`, or for a normalized
  // token, its content normalized (as Hugging Face's id-to-token map has it).
  std::string decoded_content;
  // The id Hugging Face gives the token when it loads the file (see
  // AddedVocabulary::FromJson), not necessarily the file's "id".
  int64_t id = 0;
  // Matched only where it is a whole word (no \w character on either side).
  bool single_word = false;
  // The match takes the whitespace to its left / right with it.
  bool lstrip = false;
  bool rstrip = false;
  // Matched in the normalized text (with its content normalized) rather
  // than in the raw input.
  bool normalized = false;
  // Special: dropped by decoding with SkipSpecialTokens::kYes.
  bool special = false;
};

// A part of the input: either an added token's match or text between
// matches, as byte offsets.
struct TextSplit {
  size_t begin = 0;
  size_t end = 0;
  // The matched added token, or null for plain text.
  const AddedToken* token = nullptr;
};

// The added (and special) tokens of a tokenizer.json, found in the input
// before pre-tokenization as Hugging Face's AddedVocabulary does: the
// leftmost match, longest first, of the non-normalized tokens in the raw
// text and of the normalized tokens in the normalized text, with the
// single_word / lstrip / rstrip rules. Immutable after FromJson();
// thread-safe.
class AddedVocabulary {
 public:
  // `added_tokens` is the file's "added_tokens" array (or null). Ids are
  // assigned as Hugging Face does on load: the id of an earlier added token
  // or model token with the same content, else the next id after the model
  // vocabulary and every added id so far; empty contents are ignored.
  // `normalizer` spells the normalized tokens' patterns. InvalidArgument
  // naming the entry for a malformed one.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> FromJson(
      const nlohmann::json& added_tokens, const BpeModel& model,
      const Normalizer& normalizer);

  AddedVocabulary(const AddedVocabulary&) = delete;
  AddedVocabulary& operator=(const AddedVocabulary&) = delete;

  // Splits raw text at the tokens with normalized == false.
  std::vector<TextSplit> SplitRaw(absl::string_view text) const {
    return Split(text, raw_);
  }
  // Splits normalized text at the tokens with normalized == true.
  std::vector<TextSplit> SplitNormalized(absl::string_view text) const {
    return Split(text, normalized_);
  }

  // The token with this id / content, or null.
  const AddedToken* FindById(int64_t id) const;
  const AddedToken* FindByContent(absl::string_view content) const;
  // Every added token, in file order (one entry per distinct content).
  const std::vector<std::unique_ptr<AddedToken>>& tokens() const {
    return tokens_;
  }

 private:
  // A byte trie of token patterns.
  struct Matcher {
    // (node << 8 | byte) -> child node; node 0 is the root.
    absl::flat_hash_map<uint64_t, uint32_t> edges;
    // The token ending at each node, or null.
    std::vector<const AddedToken*> terminal{nullptr};
    bool first_byte[256] = {};

    void Add(absl::string_view pattern, const AddedToken* token);
  };

  AddedVocabulary() = default;
  std::vector<TextSplit> Split(absl::string_view text,
                               const Matcher& matcher) const;

  std::vector<std::unique_ptr<AddedToken>> tokens_;
  absl::flat_hash_map<int64_t, const AddedToken*> by_id_;
  absl::flat_hash_map<std::string, AddedToken*> by_content_;
  Matcher raw_;
  Matcher normalized_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_ADDED_VOCABULARY_H_
