#include "tools/synthetic/synthetic_tokenizer.h"

#include <fstream>

#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/tokenizer_vocab.h"
#include "gtest/gtest.h"

namespace mneme::synthetic {
namespace {

using engram::CompressedVocabulary;
using engram::TokenizerVocab;

class SyntheticTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TokenizerVocab>> tokenizer =
        TokenizerVocab::FromJson(SyntheticTokenizerJson(), "synthetic");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    absl::StatusOr<std::unique_ptr<CompressedVocabulary>> vocab =
        CompressedVocabulary::FromTokenizer(
            *tokenizer_, engram::CleanUpTokenizationSpaces::kNo);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    vocab_ = *std::move(vocab);
    for (int64_t id = 0; id < tokenizer_->size(); ++id) {
      std::optional<absl::string_view> token = tokenizer_->TokenString(id);
      if (token.has_value()) {
        ids_[std::string(tokenizer_->Decode(
            id, engram::CleanUpTokenizationSpaces::kNo))] = id;
      }
    }
  }

  // The compressed id of the token whose decoded text is `text`.
  int64_t Cid(const std::string& text) {
    auto it = ids_.find(text);
    EXPECT_NE(it, ids_.end()) << "no token decodes to '" << text << "'";
    if (it == ids_.end()) return -1;
    return *vocab_->Lookup(it->second);
  }

  std::unique_ptr<TokenizerVocab> tokenizer_;
  std::unique_ptr<CompressedVocabulary> vocab_;
  std::map<std::string, int64_t> ids_;
};

TEST_F(SyntheticTokenizerTest, SizesAndSpecialTokens) {
  EXPECT_EQ(tokenizer_->size(), SyntheticVocabSize());
  EXPECT_EQ(*tokenizer_->TokenString(kBosTokenId), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(*tokenizer_->TokenString(kEosTokenId), "<｜end▁of▁sentence｜>");
  EXPECT_EQ(*tokenizer_->TokenString(kPadTokenId), "<｜▁pad▁｜>");
  EXPECT_EQ(SyntheticTokenizerJson(), SyntheticTokenizerJson());
}

TEST_F(SyntheticTokenizerTest, ExercisesEveryNormalizationRule) {
  // Case and surrounding spaces.
  EXPECT_EQ(Cid("Hello"), Cid("hello"));
  EXPECT_EQ(Cid(" HELLO"), Cid("hello"));
  // Accents.
  EXPECT_EQ(Cid("café"), Cid("cafe"));
  EXPECT_EQ(Cid("Café"), Cid("cafe"));
  EXPECT_EQ(Cid("naïve"), Cid("naive"));
  // NFKC compatibility forms.
  EXPECT_EQ(Cid("ＡＢＣ"), Cid("abc"));
  EXPECT_EQ(Cid("ﬁ"), Cid("fi"));
  EXPECT_EQ(Cid("x²"), Cid("x2"));
  // Whitespace runs collapse to one space, which is kept.
  EXPECT_EQ(Cid("  "), Cid(" "));
  EXPECT_EQ(Cid("\n\n"), Cid(" "));
  EXPECT_EQ(Cid("\t"), Cid(" "));
  // Different words stay apart.
  EXPECT_NE(Cid("hello"), Cid("cafe"));
  EXPECT_NE(Cid("中"), Cid("文"));
  // Special tokens keep their own ids.
  EXPECT_NE(*vocab_->Lookup(kBosTokenId), *vocab_->Lookup(kEosTokenId));
}

TEST_F(SyntheticTokenizerTest, HasTokensSplittingMultiByteCharacters) {
  int partial = 0;
  for (int64_t id = 0; id < tokenizer_->size(); ++id) {
    if (tokenizer_->Decode(id, engram::CleanUpTokenizationSpaces::kNo)
            .find("\xEF\xBF\xBD") != std::string::npos) {
      ++partial;
    }
  }
  // Every raw byte >= 0x80 and the split prefixes of CJK and emoji words.
  EXPECT_GT(partial, 128);
}

}  // namespace
}  // namespace mneme::synthetic
