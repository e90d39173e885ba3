#ifndef MNEME_TEXT_TOKENIZER_JSON_H_
#define MNEME_TEXT_TOKENIZER_JSON_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

// Field access for the components of a tokenizer.json (normalizers,
// pre-tokenizers, post-processors, decoders), on top of common/json.h. Every
// error is InvalidArgument and names the component (`what`, e.g. "normalizer
// Replace") and the field.
namespace mneme::text {

// A Split / Replace pattern: {"String": literal} or {"Regex": pattern}.
struct Pattern {
  std::string text;
  bool is_regex = false;
};

// The component's "type" string; `what` names the component in errors.
absl::StatusOr<std::string> TypeOf(const nlohmann::json& spec,
                                   absl::string_view what);
// A required string field.
absl::StatusOr<std::string> StringField(const nlohmann::json& spec,
                                        const char* field,
                                        absl::string_view what);
// An optional boolean field: `default_value` when absent or null.
absl::StatusOr<bool> BoolField(const nlohmann::json& spec, const char* field,
                               bool default_value, absl::string_view what);
// The "pattern" field.
absl::StatusOr<Pattern> PatternOf(const nlohmann::json& spec,
                                  absl::string_view what);

// Most Sequence components nested in one another (a normalizer Sequence
// inside a normalizer Sequence is 2). Hugging Face files use 1, rarely 2; the
// bound keeps the recursion of a hostile file shallow.
inline constexpr int kMaxSequenceDepth = 8;

// For a component of type "Sequence" (`type`, from TypeOf) at nesting
// `depth` (0 for the top-level component, members of a Sequence at depth d
// are at d + 1): calls `add(member, depth + 1)` on each member of its
// `list_key` array, in order, and returns true; false (nothing called) for
// any other type. InvalidArgument naming `what` when the array is missing or
// when the Sequence would be the (kMaxSequenceDepth + 1)-th nested one; the
// first error of `add` otherwise.
absl::StatusOr<bool> ExpandSequence(
    const nlohmann::json& spec, absl::string_view type, const char* list_key,
    absl::string_view what, int depth,
    const std::function<absl::Status(const nlohmann::json&, int)>& add);

}  // namespace mneme::text

#endif  // MNEME_TEXT_TOKENIZER_JSON_H_
