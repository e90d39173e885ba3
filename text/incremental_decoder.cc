#include "text/incremental_decoder.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace mneme::text {

std::string IncrementalDecoder::Add(int64_t id) {
  std::optional<std::string> bytes = tokenizer_.DecodedBytes(id, skip_);
  if (!bytes.has_value()) return "";
  if (started_) {
    const absl::string_view separator = tokenizer_.decode_separator();
    pending_.append(separator.data(), separator.size());
  }
  started_ = true;
  pending_.append(*bytes);
  const size_t complete = CompleteUtf8PrefixLength(pending_);
  std::string text =
      text::Utf8Lossy(absl::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return text;
}

std::string IncrementalDecoder::Finish() {
  std::string text = text::Utf8Lossy(pending_);
  pending_.clear();
  started_ = false;
  return text;
}

}  // namespace mneme::text
