#include "text/unicode_regex.h"

#include <unicode/parseerr.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>
#include <unicode/utypes.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace mneme::text {
namespace {

// ICU's default backtracking stack, and the allowance per byte of text.
constexpr int64_t kMinStackBytes = int64_t{8} << 20;
constexpr int64_t kStackBytesPerTextByte = 256;

}  // namespace

UnicodeRegex::UnicodeRegex(std::unique_ptr<icu::RegexPattern> pattern)
    : pattern_(std::move(pattern)) {}

UnicodeRegex::~UnicodeRegex() = default;

absl::StatusOr<std::unique_ptr<UnicodeRegex>> UnicodeRegex::Create(
    absl::string_view pattern) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error{};
  const icu::UnicodeString source = icu::UnicodeString::fromUTF8(
      icu::StringPiece(pattern.data(), static_cast<int32_t>(pattern.size())));
  std::unique_ptr<icu::RegexPattern> compiled(
      icu::RegexPattern::compile(source, /*flags=*/0, parse_error, status));
  if (U_FAILURE(status) || compiled == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", pattern, "\" does not compile (", u_errorName(status),
        " at offset ", parse_error.offset, ")"));
  }
  return std::unique_ptr<UnicodeRegex>(new UnicodeRegex(std::move(compiled)));
}

UnicodeRegex::Matcher::Matcher(const UnicodeRegex& regex) {
  UErrorCode status = U_ZERO_ERROR;
  matcher_.reset(regex.pattern_->matcher(status));
  CHECK(U_SUCCESS(status)) << "ICU matcher: " << u_errorName(status);
}

UnicodeRegex::Matcher::~Matcher() = default;

absl::Status UnicodeRegex::Matcher::FindAll(absl::string_view text,
                                            std::vector<ByteRange>* matches) {
  if (text.empty()) return absl::OkStatus();
  UErrorCode status = U_ZERO_ERROR;
  // A UTF-8 UText on the stack: the matcher's native indices are byte
  // offsets.
  UText input = UTEXT_INITIALIZER;
  utext_openUTF8(&input, text.data(), static_cast<int64_t>(text.size()),
                 &status);
  // A quantifier that backtracks keeps a frame per character it consumed
  // (e.g. \s* over a whitespace run), so the default 8 MB stack would fail
  // on runs of a few hundred thousand characters. Allow memory in proportion
  // to the text instead.
  const int64_t stack_limit = std::min<int64_t>(
      std::numeric_limits<int32_t>::max(),
      std::max<int64_t>(kMinStackBytes, kStackBytesPerTextByte *
                                            static_cast<int64_t>(text.size())));
  if (stack_limit > stack_limit_) {
    matcher_->setStackLimit(static_cast<int32_t>(stack_limit), status);
    stack_limit_ = stack_limit;
  }
  matcher_->reset(&input);
  while (U_SUCCESS(status) && matcher_->find(status) && U_SUCCESS(status)) {
    const int64_t begin = matcher_->start64(status);
    const int64_t end = matcher_->end64(status);
    matches->push_back({static_cast<size_t>(begin), static_cast<size_t>(end)});
  }
  // The matcher must not keep the text that is going away.
  UErrorCode reset_status = U_ZERO_ERROR;
  UText empty = UTEXT_INITIALIZER;
  utext_openUTF8(&empty, "", 0, &reset_status);
  matcher_->reset(&empty);
  utext_close(&empty);
  utext_close(&input);
  if (U_FAILURE(status)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("regex search over ", text.size(),
                     " bytes failed: ", u_errorName(status)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ByteRange>> UnicodeRegex::FindAll(
    absl::string_view text) const {
  std::vector<ByteRange> matches;
  Matcher matcher(*this);
  RETURN_IF_ERROR(matcher.FindAll(text, &matches));
  return matches;
}

}  // namespace mneme::text
