#ifndef MNEME_TEXT_UNICODE_REGEX_H_
#define MNEME_TEXT_UNICODE_REGEX_H_

#include <unicode/uversion.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

U_NAMESPACE_BEGIN
class RegexMatcher;
class RegexPattern;
U_NAMESPACE_END

namespace mneme::text {

// A [begin, end) range of byte offsets into UTF-8 text.
struct ByteRange {
  size_t begin = 0;
  size_t end = 0;

  friend bool operator==(const ByteRange& a, const ByteRange& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// A compiled regular expression over Unicode text, for the patterns of
// Hugging Face tokenizer.json files (written for Oniguruma: \p{L}, \p{N},
// \s as the White_Space property, look-ahead, (?i:...)), run with ICU, whose
// syntax and leftmost-first backtracking semantics agree on them.
// Immutable after Create(); thread-safe (each search uses its own matcher).
class UnicodeRegex {
 public:
  // InvalidArgument (with ICU's reason and the pattern) if `pattern` does not
  // compile.
  static absl::StatusOr<std::unique_ptr<UnicodeRegex>> Create(
      absl::string_view pattern);

  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Search state for many searches in a row (cheaper than FindAll() on each
  // text). One per thread; borrows the regex.
  class Matcher {
   public:
    explicit Matcher(const UnicodeRegex& regex);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // Appends to *matches the non-overlapping matches in `text` (well-formed
    // UTF-8), left to right, as byte ranges. An empty match is reported and
    // the search goes on one character later. ResourceExhausted if the
    // search outgrows ICU's backtracking stack (allowed 256 bytes per byte of
    // text, at least 8 MB): only a pathological pattern and text do.
    absl::Status FindAll(absl::string_view text,
                         std::vector<ByteRange>* matches);

   private:
    std::unique_ptr<icu::RegexMatcher> matcher_;
    int64_t stack_limit_ = 0;
  };

  // As Matcher::FindAll() with a matcher of its own.
  absl::StatusOr<std::vector<ByteRange>> FindAll(absl::string_view text) const;

 private:
  explicit UnicodeRegex(std::unique_ptr<icu::RegexPattern> pattern);

  std::unique_ptr<icu::RegexPattern> pattern_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_UNICODE_REGEX_H_
