#include "text/stop_matcher.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/text/test_tokenizers.h"
#include "text/incremental_decoder.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

// Feeds `deltas`; returns what was sent (with Finish() if no stop) and the
// stop found.
struct Outcome {
  std::string sent;
  std::optional<size_t> stop;
};

Outcome FeedAll(std::vector<std::string> stops,
                const std::vector<std::string>& deltas) {
  StopMatcher matcher(std::move(stops));
  Outcome outcome;
  for (const std::string& delta : deltas) {
    StopMatcher::Result result = matcher.Feed(delta);
    outcome.sent += result.text;
    if (result.stop.has_value()) {
      outcome.stop = result.stop;
      EXPECT_TRUE(matcher.stopped());
      return outcome;
    }
  }
  outcome.sent += matcher.Finish();
  return outcome;
}

TEST(StopMatcherTest, PassesTextThroughWithoutStops) {
  const Outcome outcome = FeedAll({}, {"Hello", " ", "world"});
  EXPECT_EQ(outcome.sent, "Hello world");
  EXPECT_FALSE(outcome.stop.has_value());
  const Outcome empty_stops = FeedAll({"", ""}, {"a", "b"});
  EXPECT_EQ(empty_stops.sent, "ab");
}

TEST(StopMatcherTest, StopsWithinOneDelta) {
  const Outcome outcome = FeedAll({"STOP"}, {"one two STOP three"});
  EXPECT_EQ(outcome.sent, "one two ");
  EXPECT_EQ(outcome.stop, 0u);
}

TEST(StopMatcherTest, FindsAStopSplitAcrossDeltas) {
  const Outcome outcome =
      FeedAll({"\n\nUser:"}, {"Answer.", "\n", "\nUs", "er", ":", " more"});
  EXPECT_EQ(outcome.sent, "Answer.");
  EXPECT_EQ(outcome.stop, 0u);
}

TEST(StopMatcherTest, HoldsBackAPossibleStartAndReleasesIt) {
  StopMatcher matcher({"</answer>"});
  StopMatcher::Result first = matcher.Feed("x </ans");
  EXPECT_EQ(first.text, "x ");
  EXPECT_EQ(matcher.held_bytes(), 5u);
  StopMatcher::Result second = matcher.Feed("wer is near");
  EXPECT_EQ(second.text, "</answer is near");
  EXPECT_FALSE(second.stop.has_value());
  EXPECT_EQ(matcher.held_bytes(), 0u);
  matcher.Feed("... <");
  EXPECT_EQ(matcher.Finish(), "<");
}

TEST(StopMatcherTest, TheEarliestStopWins) {
  const Outcome earliest = FeedAll({"late", "early"}, {"an early and a late"});
  EXPECT_EQ(earliest.stop, 1u);
  EXPECT_EQ(earliest.sent, "an ");
  // Two stops starting at one place: the first listed.
  const Outcome longer_first = FeedAll({"abc", "ab"}, {"xxabcd"});
  EXPECT_EQ(longer_first.stop, 0u);
  const Outcome shorter_first = FeedAll({"ab", "abc"}, {"xxabcd"});
  EXPECT_EQ(shorter_first.stop, 0u);
  // A held-back start completed by the next delta starts earlier than a
  // stop found inside that delta.
  const Outcome later = FeedAll({"END", "N"}, {"E", "ND"});
  EXPECT_EQ(later.sent, "");
  EXPECT_EQ(later.stop, 0u);
}

TEST(StopMatcherTest, StopAtTheVeryStart) {
  const Outcome outcome = FeedAll({"Hi"}, {"H", "i there"});
  EXPECT_EQ(outcome.sent, "");
  EXPECT_EQ(outcome.stop, 0u);
}

TEST(StopMatcherTest, NothingAfterTheStop) {
  StopMatcher matcher({"."});
  EXPECT_EQ(matcher.Feed("a.b").text, "a");
  EXPECT_EQ(matcher.Feed("more").text, "");
  EXPECT_EQ(matcher.Finish(), "");
}

TEST(StopMatcherTest, MultiByteStops) {
  const Outcome outcome = FeedAll({"。\n"}, {"中文", "。", "\n", "下一句"});
  EXPECT_EQ(outcome.sent, "中文");
  EXPECT_EQ(outcome.stop, 0u);
  const Outcome emoji = FeedAll({"🙂🙂"}, {"a🙂", "b🙂", "🙂c"});
  EXPECT_EQ(emoji.sent, "a🙂b");
}

// Stop strings over a real token stream: a stop spread over several tokens
// (and over the bytes of a character) is found and never partly sent.
TEST(StopMatcherTest, AcrossTokenBoundaries) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("deepseek_style");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text =
      "def f(x):\n    return x\n\n\nclass Model: 中文🙂 done";
  absl::StatusOr<std::vector<int64_t>> ids =
      (*tokenizer)->Encode(text, AddSpecialTokens::kNo);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_GT(ids->size(), 10u);
  for (const std::string& stop :
       {std::string("\n\n\nclass"), std::string("turn x"),
        std::string("文🙂 d"), std::string("(x):\n")}) {
    const size_t at = text.find(stop);
    ASSERT_NE(at, std::string::npos) << stop;
    IncrementalDecoder decoder(**tokenizer, SkipSpecialTokens::kNo);
    StopMatcher matcher({"never there", stop});
    std::string sent;
    std::optional<size_t> found;
    for (int64_t id : *ids) {
      StopMatcher::Result result = matcher.Feed(decoder.Add(id));
      sent += result.text;
      // Nothing of the stop is ever sent.
      EXPECT_LE(sent.size(), at) << stop;
      if (result.stop.has_value()) {
        found = result.stop;
        break;
      }
    }
    EXPECT_EQ(found, 1u) << stop;
    EXPECT_EQ(sent, text.substr(0, at)) << stop;
  }
}

}  // namespace
}  // namespace mneme::text
