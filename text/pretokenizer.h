#ifndef MNEME_TEXT_PRETOKENIZER_H_
#define MNEME_TEXT_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::text {

// The "pre_tokenizer" of a Hugging Face tokenizer.json: splits normalized
// text into the pieces ("words") the model tokenizes independently.
// Supported types:
//  - Split: {"String": literal} or {"Regex": pattern} (ICU, see
//    UnicodeRegex), behavior Removed / Isolated / MergedWithPrevious /
//    MergedWithNext / Contiguous, invert;
//  - ByteLevel: add_prefix_space (a ' ' before each piece that does not start
//    with one), use_regex (the GPT-2 split), then every byte of each piece
//    spelled in the GPT-2 byte-level alphabet;
//  - Sequence of these, each applied to every piece of the previous one;
//  - null: the whole text is one piece.
// Empty pieces are dropped, as Hugging Face does. Immutable after
// FromJson(); thread-safe.
class PreTokenizer {
 public:
  // `spec` is the pre_tokenizer's JSON value. InvalidArgument naming the type
  // for an unsupported pre-tokenizer, the field for a malformed one, or the
  // pattern for a regex that does not compile.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(
      const nlohmann::json& spec);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (well-formed UTF-8) to *pieces.
  // ResourceExhausted if a regex search outgrows ICU's backtracking stack.
  absl::Status PreTokenize(absl::string_view text,
                           std::vector<std::string>* pieces) const;

 private:
  struct Step;

  PreTokenizer();
  // Appends the steps of `spec`, a component at Sequence nesting `depth`
  // (see ExpandSequence).
  absl::Status AddSteps(const nlohmann::json& spec, int depth);

  std::vector<Step> steps_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_PRETOKENIZER_H_
