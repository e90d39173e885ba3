// The tokenizer against the Hugging Face reference: ids, decodes and lookups
// that the `tokenizers` library gave for the same tokenizer.json files on a
// varied corpus (testdata/*.expected.json, written by
// testdata/generate_reference.js; see testdata/README.md).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/text/test_tokenizers.h"
#include "text/tokenizer.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::text {
namespace {

std::vector<int64_t> Ids(const nlohmann::json& value) {
  return value.get<std::vector<int64_t>>();
}

// A short, printable rendering of a text for failure messages.
std::string Show(const std::string& text) {
  std::string shown = nlohmann::json(text).dump();
  if (shown.size() > 120) shown = shown.substr(0, 117) + "...";
  return shown;
}

class TokenizerReferenceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    expected_ = nlohmann::json::parse(
        ReadTestdata(absl::StrCat(GetParam(), ".expected.json")));
    TokenizerOptions options;
    if (expected_["tokenizer_config"].is_string()) {
      options.tokenizer_config_path =
          TestdataPath(expected_["tokenizer_config"].get<std::string>());
    }
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(
        TestdataPath(expected_["tokenizer"].get<std::string>()), options);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  nlohmann::json expected_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(TokenizerReferenceTest, EncodesTokenForToken) {
  ASSERT_GT(expected_["cases"].size(), 50u);
  for (const nlohmann::json& c : expected_["cases"]) {
    const std::string text = c["text"];
    absl::StatusOr<std::vector<int64_t>> ids =
        tokenizer_->Encode(text, AddSpecialTokens::kNo);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, Ids(c["ids"])) << "text " << Show(text);
    absl::StatusOr<std::vector<int64_t>> with_special =
        tokenizer_->Encode(text, AddSpecialTokens::kYes);
    ASSERT_TRUE(with_special.ok()) << with_special.status();
    EXPECT_EQ(*with_special, Ids(c["ids_with_special"]))
        << "text " << Show(text) << " with special tokens";
  }
}

TEST_P(TokenizerReferenceTest, DecodesAsTheReference) {
  for (const nlohmann::json& c : expected_["cases"]) {
    EXPECT_EQ(tokenizer_->Decode(Ids(c["ids"]), SkipSpecialTokens::kNo),
              c["decoded"].get<std::string>())
        << "ids of " << Show(c["text"]);
    EXPECT_EQ(
        tokenizer_->Decode(Ids(c["ids_with_special"]), SkipSpecialTokens::kYes),
        c["decoded_skip_special"].get<std::string>())
        << "ids of " << Show(c["text"]) << " skipping special tokens";
  }
  ASSERT_GT(expected_["decodes"].size(), 20u);
  for (const nlohmann::json& d : expected_["decodes"]) {
    EXPECT_EQ(tokenizer_->Decode(Ids(d["ids"]), SkipSpecialTokens::kNo),
              d["text"].get<std::string>())
        << "ids " << d["ids"].dump();
    EXPECT_EQ(tokenizer_->Decode(Ids(d["ids"]), SkipSpecialTokens::kYes),
              d["text_skip_special"].get<std::string>())
        << "ids " << d["ids"].dump() << " skipping special tokens";
  }
}

TEST_P(TokenizerReferenceTest, LooksUpTokensAsTheReference) {
  EXPECT_EQ(tokenizer_->vocab_size(), expected_["vocab_size"].get<int64_t>());
  for (const nlohmann::json& lookup : expected_["lookups"]) {
    const std::string token = lookup["token"];
    const std::optional<int64_t> id = tokenizer_->TokenToId(token);
    if (lookup["id"].is_null()) {
      EXPECT_FALSE(id.has_value()) << token;
      continue;
    }
    ASSERT_TRUE(id.has_value()) << token;
    EXPECT_EQ(*id, lookup["id"].get<int64_t>()) << token;
    EXPECT_EQ(tokenizer_->IdToToken(*id),
              lookup["id_to_token"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Files, TokenizerReferenceTest,
                         ::testing::Values("synthetic", "deepseek_style",
                                           "gpt2_style", "llama3_style",
                                           "wordpiece_style"));

// The expected ids of the synthetic tokenizer hold only while the checked-in
// file is what the project's generator writes.
TEST(SyntheticTokenizerFileTest, MatchesTheGenerator) {
  EXPECT_EQ(ReadTestdata("synthetic_tokenizer.json"),
            synthetic::SyntheticTokenizerJson())
      << "tools/synthetic changed the synthetic tokenizer: regenerate the "
         "test data (tests/text/testdata/README.md)";
}

// Byte-level files without a normalizer give back the text they encoded.
TEST(RoundTripTest, ByteLevelFilesRoundTrip) {
  for (const char* name : {"synthetic", "deepseek_style"}) {
    const nlohmann::json expected = nlohmann::json::parse(
        ReadTestdata(absl::StrCat(name, ".expected.json")));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Create(
        TestdataPath(expected["tokenizer"].get<std::string>()));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    for (const nlohmann::json& c : expected["cases"]) {
      const std::string text = c["text"];
      absl::StatusOr<std::vector<int64_t>> ids =
          (*tokenizer)->Encode(text, AddSpecialTokens::kNo);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ((*tokenizer)->Decode(*ids, SkipSpecialTokens::kNo), text)
          << name << " " << Show(text);
    }
  }
}

}  // namespace
}  // namespace mneme::text
