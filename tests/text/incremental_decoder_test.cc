#include "text/incremental_decoder.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/text/test_tokenizers.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace mneme::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

TEST(CompleteUtf8PrefixLengthTest, HoldsBackOnlyIncompleteCharacters) {
  EXPECT_EQ(CompleteUtf8PrefixLength(""), 0u);
  EXPECT_EQ(CompleteUtf8PrefixLength("abc"), 3u);
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xC3"), 1u);             // é, 1 of 2.
  EXPECT_EQ(CompleteUtf8PrefixLength("a\xC3\xA9"), 3u);         // é.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xE4\xB8"), 0u);          // 中, 2 of 3.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xF0\x9F\x99"), 0u);      // 🙂, 3 of 4.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xF0\x9F\x99\x82"), 4u);  // 🙂.
  // Never well-formed, whatever follows: not held back.
  EXPECT_EQ(CompleteUtf8PrefixLength("a\x80"), 2u);     // Stray continuation.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xC0"), 1u);      // Not a lead byte.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xE0\x80"), 2u);  // Overlong.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xED\xA0"), 2u);  // Surrogate.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xF4\x90"), 2u);  // Past U+10FFFF.
  // An incomplete character after a broken one: only the new one is held.
  EXPECT_EQ(CompleteUtf8PrefixLength("\xE4\xB8\xE4"), 2u);
}

// Feeds `ids` one at a time; checks every delta is well-formed UTF-8 and that
// the deltas add up to Decode().
void ExpectStreamsAsDecode(const Tokenizer& tokenizer,
                           const std::vector<int64_t>& ids,
                           SkipSpecialTokens skip, const std::string& what) {
  IncrementalDecoder decoder(tokenizer, skip);
  std::string streamed;
  for (int64_t id : ids) {
    const std::string delta = decoder.Add(id);
    EXPECT_TRUE(IsWellFormedUtf8(delta)) << what;
    EXPECT_LE(decoder.pending_bytes(), 3u) << what;
    streamed += delta;
  }
  const std::string tail = decoder.Finish();
  EXPECT_TRUE(IsWellFormedUtf8(tail)) << what;
  streamed += tail;
  EXPECT_EQ(streamed, tokenizer.Decode(ids, skip)) << what;
}

class IncrementalDecoderTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        LoadTestTokenizer(GetParam());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(IncrementalDecoderTest, ConcatenatedDeltasEqualDecodeOnTheCorpus) {
  const nlohmann::json expected = nlohmann::json::parse(
      ReadTestdata(absl::StrCat(GetParam(), ".expected.json")));
  for (const nlohmann::json& c : expected["cases"]) {
    const std::vector<int64_t> ids =
        c["ids_with_special"].get<std::vector<int64_t>>();
    const std::string what = c["text"].dump();
    ExpectStreamsAsDecode(*tokenizer_, ids, SkipSpecialTokens::kNo, what);
    ExpectStreamsAsDecode(*tokenizer_, ids, SkipSpecialTokens::kYes, what);
  }
}

TEST_P(IncrementalDecoderTest, ConcatenatedDeltasEqualDecodeOnRandomIds) {
  // Random ids split characters across tokens in every way, give broken
  // sequences (U+FFFD) and ids without a token.
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<int64_t> id(0, tokenizer_->vocab_size() + 3);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> ids(1 + trial % 40);
    for (int64_t& value : ids) value = id(rng);
    ExpectStreamsAsDecode(*tokenizer_, ids, SkipSpecialTokens::kNo,
                          absl::StrCat("trial ", trial));
    ExpectStreamsAsDecode(*tokenizer_, ids, SkipSpecialTokens::kYes,
                          absl::StrCat("trial ", trial));
  }
}

INSTANTIATE_TEST_SUITE_P(Files, IncrementalDecoderTest,
                         ::testing::Values("synthetic", "deepseek_style",
                                           "gpt2_style", "llama3_style",
                                           "wordpiece_style"));

TEST(IncrementalDecoderBytesTest, HoldsBackACharacterSplitAcrossTokens) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("synthetic");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // The synthetic vocabulary has each byte as a token: 🙂 as its four bytes.
  const std::string smile = "\xF0\x9F\x99\x82";
  std::vector<int64_t> bytes;
  for (char c : smile) {
    std::optional<int64_t> byte_id;
    for (int64_t id = 0; id < (*tokenizer)->vocab_size(); ++id) {
      const std::optional<std::string> b =
          (*tokenizer)->DecodedBytes(id, SkipSpecialTokens::kNo);
      if (b.has_value() && *b == std::string(1, c)) {
        byte_id = id;
        break;
      }
    }
    ASSERT_TRUE(byte_id.has_value());
    bytes.push_back(*byte_id);
  }
  IncrementalDecoder decoder(**tokenizer, SkipSpecialTokens::kNo);
  EXPECT_EQ(decoder.Add(bytes[0]), "");
  EXPECT_EQ(decoder.Add(bytes[1]), "");
  EXPECT_EQ(decoder.Add(bytes[2]), "");
  EXPECT_EQ(decoder.pending_bytes(), 3u);
  EXPECT_EQ(decoder.Add(bytes[3]), smile);
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  // A character cut off by the end of the stream becomes U+FFFD once.
  EXPECT_EQ(decoder.Add(bytes[0]), "");
  EXPECT_EQ(decoder.Add(bytes[1]), "");
  EXPECT_EQ(decoder.Finish(), kReplacement);
  // A new character interrupting one: the broken one is U+FFFD at once.
  EXPECT_EQ(decoder.Add(bytes[0]), "");
  EXPECT_EQ(decoder.Add(bytes[0]), kReplacement);
  EXPECT_EQ(decoder.Finish(), kReplacement);
}

TEST(IncrementalDecoderBytesTest, SkipsSpecialTokensAndUnknownIds) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("deepseek_style");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::vector<int64_t>> ids =
      (*tokenizer)->Encode("Hello world", AddSpecialTokens::kYes);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ((*ids)[0], *(*tokenizer)->bos_id());
  IncrementalDecoder skipping(**tokenizer, SkipSpecialTokens::kYes);
  EXPECT_EQ(skipping.Add((*ids)[0]), "");
  EXPECT_EQ(skipping.Add(int64_t{1} << 31), "");
  std::string text;
  for (size_t i = 1; i < ids->size(); ++i) text += skipping.Add((*ids)[i]);
  text += skipping.Finish();
  EXPECT_EQ(text, "Hello world");
  IncrementalDecoder keeping(**tokenizer, SkipSpecialTokens::kNo);
  EXPECT_EQ(keeping.Add((*ids)[0]), "<｜begin▁of▁sentence｜>");
}

}  // namespace
}  // namespace mneme::text
