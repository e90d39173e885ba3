#include "services/coordinator/text_stream.h"

#include <optional>
#include <utility>

namespace mneme::coordinator {

TextStream::TextStream(const text::Tokenizer& tokenizer,
                       std::vector<std::string> stops)
    : tokenizer_(tokenizer),
      decoder_(tokenizer, text::SkipSpecialTokens::kYes),
      stops_(std::move(stops)) {}

std::string TextStream::Add(absl::Span<const int64_t> tokens) {
  std::string out;
  for (int64_t id : tokens) {
    if (stopped_) break;
    text::StopMatcher::Result r = stops_.Feed(decoder_.Add(id));
    out += r.text;
    if (r.stop.has_value()) stopped_ = true;
  }
  return out;
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  text::StopMatcher::Result r = stops_.Feed(decoder_.Finish());
  if (r.stop.has_value()) {
    stopped_ = true;
    return r.text;
  }
  return r.text + stops_.Finish();
}

std::string TextStream::TokenText(int64_t id) const {
  std::optional<absl::string_view> t = tokenizer_.IdToToken(id);
  return t.has_value() ? std::string(*t) : "";
}

}  // namespace mneme::coordinator
