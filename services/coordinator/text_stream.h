#ifndef MNEME_SERVICES_COORDINATOR_TEXT_STREAM_H_
#define MNEME_SERVICES_COORDINATOR_TEXT_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "text/incremental_decoder.h"
#include "text/stop_matcher.h"
#include "text/tokenizer.h"

namespace mneme::coordinator {

// A request's generated tokens as streamed text: decoded incrementally
// (never half a UTF-8 character, special tokens skipped) and cut at the
// first stop string (which is not emitted). Thread-compatible; the
// tokenizer is borrowed.
class TextStream {
 public:
  TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stops);

  // The text the new tokens complete; sets stopped() when a stop string
  // appeared (later tokens add nothing).
  std::string Add(absl::Span<const int64_t> tokens);
  // The end of the stream: what was held back.
  std::string Finish();
  bool stopped() const { return stopped_; }
  // The token string of an id (for logprobs), "" if it has none.
  std::string TokenText(int64_t id) const;

 private:
  const text::Tokenizer& tokenizer_;
  text::IncrementalDecoder decoder_;
  text::StopMatcher stops_;
  bool stopped_ = false;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_TEXT_STREAM_H_
