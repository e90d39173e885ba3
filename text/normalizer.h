#ifndef MNEME_TEXT_NORMALIZER_H_
#define MNEME_TEXT_NORMALIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::text {

class UnicodeRegex;

// The "normalizer" of a Hugging Face tokenizer.json, applied to the input
// text (the parts that are not added tokens) before pre-tokenization.
// Supported types: NFC, NFD, NFKC, NFKD, Lowercase, Replace (String or Regex
// pattern, literal content), Prepend, Strip, and Sequence of these; null is
// the identity. Immutable after FromJson(); thread-safe.
class Normalizer {
 public:
  // `spec` is the normalizer's JSON value. InvalidArgument naming the type
  // for an unsupported normalizer, or the field for a malformed one.
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(
      const nlohmann::json& spec);

  ~Normalizer();
  Normalizer(const Normalizer&) = delete;
  Normalizer& operator=(const Normalizer&) = delete;

  // `text` (well-formed UTF-8) normalized; well-formed UTF-8. ResourceExhausted
  // only from a Replace regex search that outgrows ICU's stack.
  absl::StatusOr<std::string> Normalize(absl::string_view text) const;

  // True when Normalize() returns its input unchanged (no steps).
  bool is_identity() const { return steps_.empty(); }

 private:
  struct Step;

  Normalizer();
  // Appends the steps of `spec`, a component at Sequence nesting `depth`
  // (see ExpandSequence).
  absl::Status AddSteps(const nlohmann::json& spec, int depth);

  std::vector<Step> steps_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_NORMALIZER_H_
