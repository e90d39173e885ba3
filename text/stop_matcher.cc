#include "text/stop_matcher.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace mneme::text {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& stop : stops) {
    longest_ = std::max(longest_, stop.size());
    stops_.push_back(std::move(stop));
  }
}

StopMatcher::Result StopMatcher::Feed(absl::string_view delta) {
  Result result;
  if (stopped_) return result;
  held_.append(delta.data(), delta.size());
  // The earliest stop in the held text and the new delta.
  std::optional<size_t> found_at;
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) continue;
    const size_t at = held_.find(stops_[i]);
    if (at != std::string::npos && (!found_at.has_value() || at < *found_at)) {
      found_at = at;
      result.stop = i;
    }
  }
  if (found_at.has_value()) {
    stopped_ = true;
    result.text = held_.substr(0, *found_at);
    held_.clear();
    return result;
  }
  // Hold back the longest tail that a stop string starts with.
  const absl::string_view text = held_;
  const size_t max_hold = longest_ > 0 ? longest_ - 1 : 0;
  size_t hold = 0;
  for (size_t length = std::min(text.size(), max_hold); length > 0 && hold == 0;
       --length) {
    const absl::string_view tail = text.substr(text.size() - length);
    for (const std::string& stop : stops_) {
      if (stop.size() > length && absl::StartsWith(stop, tail)) {
        hold = length;
        break;
      }
    }
  }
  result.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return result;
}

std::string StopMatcher::Finish() {
  std::string text = std::move(held_);
  held_.clear();
  return text;
}

}  // namespace mneme::text
