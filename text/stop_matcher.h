#ifndef MNEME_TEXT_STOP_MATCHER_H_
#define MNEME_TEXT_STOP_MATCHER_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mneme::text {

// Finds stop strings (the OpenAI API's `stop`) in streamed text. Feed it the
// text deltas as they come (e.g. from IncrementalDecoder); it says what may be
// sent now and holds back a tail that could be the start of a stop string, so
// that a stop split across deltas (tokens) is still found and none of it is
// ever sent. The output ends before the earliest stop; the stop itself is
// not part of it.
//
// Call order: Feed() until it reports a stop or the stream ends, then
// Finish() (if no stop) for the held-back tail. One per stream, not
// thread-safe.
class StopMatcher {
 public:
  // `stops`: the stop strings; empty ones are ignored. With none, Feed()
  // passes text straight through.
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    // Text to send now.
    std::string text;
    // The index in `stops` of the stop string found (the earliest in the
    // text; of those starting at one place, the first listed), after which
    // the stream ends; nullopt while none has been found.
    std::optional<size_t> stop;
  };

  // Takes the next delta. After a stop has been found, returns nothing.
  Result Feed(absl::string_view delta);

  // The end of the stream without a stop: the held-back tail.
  std::string Finish();

  bool stopped() const { return stopped_; }
  // Bytes held back now.
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_STOP_MATCHER_H_
