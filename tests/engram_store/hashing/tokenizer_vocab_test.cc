#include "engram_store/hashing/tokenizer_vocab.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/engram_store/hashing/python_runner.h"
#include "tests/engram_store/hashing/test_tokenizer.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::AddedToken;
using ::mneme::engram::testing::ByteLevelSpelling;
using ::mneme::engram::testing::MakeTokenizerJson;
using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WriteFile;

const std::string kBos =
    "<\xEF\xBD\x9C"
    "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";

std::unique_ptr<TokenizerVocab> Parse(const std::string& json) {
  absl::StatusOr<std::unique_ptr<TokenizerVocab>> vocab =
      TokenizerVocab::FromJson(json, "test/tokenizer.json");
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  return vocab.ok() ? *std::move(vocab) : nullptr;
}

TEST(TokenizerVocabTest, DecodesByteLevelTokens) {
  const auto vocab = Parse(MakeTokenizerJson(
      {kBos, ByteLevelSpelling(" hello"), ByteLevelSpelling("caf\xC3\xA9"),
       ByteLevelSpelling("\n\n"), ByteLevelSpelling("\xC3"),
       ByteLevelSpelling(" \xE2\x80")},
      {{0, kBos, true}}));
  ASSERT_NE(vocab, nullptr);
  EXPECT_EQ(vocab->size(), 6);
  const auto no = CleanUpTokenizationSpaces::kNo;
  EXPECT_EQ(vocab->Decode(0, no), kBos);  // Special: verbatim, not skipped.
  EXPECT_EQ(vocab->Decode(1, no), " hello");
  EXPECT_EQ(vocab->TokenString(1),
            std::optional<absl::string_view>("\xC4\xA0hello"));  // "Ġhello"
  EXPECT_EQ(vocab->Decode(2, no), "caf\xC3\xA9");
  EXPECT_EQ(vocab->Decode(3, no), "\n\n");
  // Partial characters decode to U+FFFD (one per maximal subpart).
  EXPECT_EQ(vocab->Decode(4, no), "\xEF\xBF\xBD");
  EXPECT_EQ(vocab->Decode(5, no), " \xEF\xBF\xBD");
  EXPECT_EQ(vocab->TokenString(4),
            std::optional<absl::string_view>("\xC3\x83"));
}

TEST(TokenizerVocabTest, AddedTokenIdsFollowHuggingFace) {
  // Specials also in the vocabulary keep their ids; new added tokens follow
  // the vocabulary; one repeating a vocab token's content takes that id; an
  // empty one is ignored.
  const auto vocab =
      Parse(MakeTokenizerJson({kBos, "a", "b"}, {{0, kBos, true},
                                                 {3, "<think>", false},
                                                 {4, "", false},
                                                 {5, "b", false},
                                                 {7, "</think>", false}}));
  ASSERT_NE(vocab, nullptr);
  EXPECT_EQ(vocab->size(), 5);
  EXPECT_EQ(vocab->TokenString(3), std::optional<absl::string_view>("<think>"));
  EXPECT_EQ(vocab->TokenString(4),
            std::optional<absl::string_view>("</think>"));
  EXPECT_EQ(vocab->TokenString(2), std::optional<absl::string_view>("b"));
  EXPECT_EQ(vocab->TokenString(5), std::nullopt);
  EXPECT_EQ(vocab->TokenString(7), std::nullopt);
  EXPECT_EQ(vocab->Decode(3, CleanUpTokenizationSpaces::kNo), "<think>");
}

TEST(TokenizerVocabTest, IdsWithoutATokenDecodeEmpty) {
  const auto vocab = Parse(MakeTokenizerJson({"a", "b", "c"}, {}, {0, 1, 3}));
  ASSERT_NE(vocab, nullptr);
  EXPECT_EQ(vocab->size(), 3);
  EXPECT_EQ(vocab->TokenString(2), std::nullopt);
  EXPECT_EQ(vocab->Decode(2, CleanUpTokenizationSpaces::kNo), "");
  EXPECT_EQ(vocab->Decode(3, CleanUpTokenizationSpaces::kNo), "c");
}

TEST(TokenizerVocabTest, CleanUpTokenizationSpaces) {
  const auto vocab =
      Parse(MakeTokenizerJson({ByteLevelSpelling("a . b ,c n't 's ' x")}, {}));
  ASSERT_NE(vocab, nullptr);
  EXPECT_EQ(vocab->Decode(0, CleanUpTokenizationSpaces::kNo),
            "a . b ,c n't 's ' x");
  EXPECT_EQ(vocab->Decode(0, CleanUpTokenizationSpaces::kYes), "a. b,cn't's'x");
}

TEST(TokenizerVocabTest, ReadsAFile) {
  const std::string path = TempPath("tokenizer_vocab_test.json");
  ASSERT_TRUE(WriteFile(path, MakeTokenizerJson({"x", "y"}, {})).ok());
  absl::StatusOr<std::unique_ptr<TokenizerVocab>> vocab =
      TokenizerVocab::Create(path);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ((*vocab)->size(), 2);
  EXPECT_EQ(TokenizerVocab::Create(TempPath("missing.json")).status().code(),
            absl::StatusCode::kNotFound);
}

struct BadCase {
  const char* json;
  absl::StatusCode code;
};

TEST(TokenizerVocabTest, MalformedFilesAreRefusedNamingTheFile) {
  const BadCase cases[] = {
      {"{", absl::StatusCode::kDataLoss},
      {"[]", absl::StatusCode::kDataLoss},
      {R"({"decoder": null})", absl::StatusCode::kDataLoss},
      {R"({"model": {"type": "BPE"}})", absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {"a": -1}}})", absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {"a": 1.5}}})", absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {"a": 4294967296}}})",
       absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {"a": 0, "b": 0}}})",
       absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {}}, "added_tokens": {}})",
       absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {}}, "added_tokens": [{"id": 1}]})",
       absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {}}, "added_tokens": [{"content": "x"}]})",
       absl::StatusCode::kDataLoss},
      {R"({"model": {"vocab": {}}, "decoder": {"x": 1}})",
       absl::StatusCode::kDataLoss},
      {R"({"model": {"type": "WordPiece", "vocab": {}}})",
       absl::StatusCode::kInvalidArgument},
      {R"({"model": {"vocab": {}}, "decoder": {"type": "Metaspace"}})",
       absl::StatusCode::kInvalidArgument},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<std::unique_ptr<TokenizerVocab>> vocab =
        TokenizerVocab::FromJson(c.json, "ckpt/tokenizer.json");
    EXPECT_EQ(vocab.status().code(), c.code) << c.json;
    EXPECT_TRUE(
        absl::StrContains(vocab.status().message(), "ckpt/tokenizer.json"))
        << vocab.status();
  }
}

TEST(TokenizerVocabTest, DecoderVariants) {
  // No decoder: the token string itself; a one-element Sequence of
  // ByteLevel: byte-level.
  const auto plain = Parse(R"({"model": {"vocab": {"\u0120a": 0}}})");
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->Decode(0, CleanUpTokenizationSpaces::kNo),
            "\xC4\xA0"
            "a");
  const auto sequence = Parse(
      R"({"model": {"vocab": {"\u0120a": 0}},
          "decoder": {"type": "Sequence",
                      "decoders": [{"type": "ByteLevel"}]}})");
  ASSERT_NE(sequence, nullptr);
  EXPECT_EQ(sequence->Decode(0, CleanUpTokenizationSpaces::kNo), " a");
}

}  // namespace
}  // namespace mneme::engram
