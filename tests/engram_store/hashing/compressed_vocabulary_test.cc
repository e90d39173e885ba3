#include "engram_store/hashing/compressed_vocabulary.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "engram_store/hashing/tokenizer_vocab.h"
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
const std::string kEos =
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
const std::string kPad =
    "<\xEF\xBD\x9C\xE2\x96\x81pad\xE2\x96\x81\xEF\xBD\x9C>";

// A small byte-level BPE tokenizer that exercises every normalization rule:
// token id -> the compressed id the reference assigns (first-seen order).
struct Entry {
  std::string token;  // As stored in tokenizer.json.
  int64_t compressed;
};

std::vector<Entry> Entries() {
  const auto sp = [](const std::string& bytes) {
    return ByteLevelSpelling(bytes);
  };
  return {
      {kBos, 0},  // Special tokens: decoded verbatim, then normalized
      {kEos, 1},  // ("<|begin▁of▁sentence|>": full-width bars -> '|').
      {kPad, 2},
      {sp("Hello"), 3},   // Case.
      {sp(" hello"), 3},  // Leading space stripped.
      {sp("HELLO"), 3},
      {sp(" HELLO"), 3},
      {sp("caf\xC3\xA9"), 4},  // café: accent.
      {sp(" Cafe"), 4},
      {sp("\xEF\xBC\xA8\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F"),
       3},           // Ｈｅｌｌｏ: full-width forms.
      {sp(" "), 5},  // Whitespace-only tokens: " ".
      {sp("  "), 5},
      {sp("\n"), 5},
      {sp("\t"), 5},
      {sp("\n\n"), 5},
      {sp("\xC2\xA0"), 5},  // NBSP.
      {sp("\xC3"), 6},      // First byte of ä: U+FFFD rule,
      {sp("\xA4"), 7},      // keyed by raw token strings.
      {sp("\xC3\xA4"), 8},  // ä -> a
      {sp("a"), 8},
      {sp("\xE2\x80"), 9},       // Two of three bytes.
      {sp(" \xC3"), 10},         // Space + partial: still raw.
      {sp("\xEF\xBF\xBD"), 11},  // A real U+FFFD: raw as well.
      {sp("\xCC\x81"), 12},      // Lone accent: normalizes to "",
                                 // keyed by its text.
      {sp("   "), 5},
      {sp("\xC4\xB0"), 13},  // İ -> i
      {sp("i"), 13},
      {sp("\xEF\xBC\x8E"), 14},  // ． -> .
      {sp("."), 14},
      {sp("a ."), 15},
      {sp("\xCE\xA3"), 16},  // Σ -> σ
      {sp("\xCF\x82"), 17},  // ς stays ς (no case folding)
      {sp("\xCF\x83"), 16},  // σ
  };
}

std::string TestTokenizerJson() {
  std::vector<std::string> vocab;
  for (const Entry& e : Entries()) vocab.push_back(e.token);
  const int64_t next = static_cast<int64_t>(vocab.size());
  return MakeTokenizerJson(vocab, {{0, kBos, true},
                                   {1, kEos, true},
                                   {2, kPad, true},
                                   {next, "<think>", false},
                                   {next + 1, "</think>", false},
                                   {next + 2, "Hello", false}});
}

std::unique_ptr<CompressedVocabulary> Build(
    CleanUpTokenizationSpaces clean_up = CleanUpTokenizationSpaces::kNo) {
  absl::StatusOr<std::unique_ptr<TokenizerVocab>> tokenizer =
      TokenizerVocab::FromJson(TestTokenizerJson(), "test");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::unique_ptr<CompressedVocabulary>> vocabulary =
      CompressedVocabulary::FromTokenizer(**tokenizer, clean_up);
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status();
  return *std::move(vocabulary);
}

TEST(CompressedVocabularyTest, NormalizationRulesAndFirstSeenIds) {
  const std::unique_ptr<CompressedVocabulary> vocabulary = Build();
  const std::vector<Entry> entries = Entries();
  // The vocabulary plus <think> and </think>; the added "Hello" is the
  // vocab token 3 and adds no id.
  ASSERT_EQ(vocabulary->num_tokens(), static_cast<int64_t>(entries.size()) + 2);
  for (size_t id = 0; id < entries.size(); ++id) {
    EXPECT_EQ(*vocabulary->Lookup(static_cast<int64_t>(id)),
              entries[id].compressed)
        << "token " << id;
  }
  EXPECT_EQ(*vocabulary->Lookup(static_cast<int64_t>(entries.size())), 18);
  EXPECT_EQ(*vocabulary->Lookup(static_cast<int64_t>(entries.size()) + 1), 19);
  EXPECT_EQ(vocabulary->size(), 20);
  EXPECT_TRUE(vocabulary->CheckSize(20).ok());
}

TEST(CompressedVocabularyTest, Keys) {
  absl::StatusOr<std::unique_ptr<TokenizerVocab>> tokenizer =
      TokenizerVocab::FromJson(TestTokenizerJson(), "test");
  ASSERT_TRUE(tokenizer.ok());
  const auto key = [&](int64_t id) {
    return *CompressionKey(**tokenizer, id, CleanUpTokenizationSpaces::kNo);
  };
  EXPECT_EQ(key(0), "<|begin\xE2\x96\x81of\xE2\x96\x81sentence|>");
  EXPECT_EQ(key(3), "hello");
  EXPECT_EQ(key(10), " ");
  EXPECT_EQ(key(16), "\xC3\x83");                  // "Ã", the raw token string
  EXPECT_EQ(key(21), "\xC4\xA0\xC3\x83");          // "ĠÃ"
  EXPECT_EQ(key(22), "\xC3\xAF\xC2\xBF\xC2\xBD");  // "ï¿½"
  EXPECT_EQ(key(23), "\xCC\x81");                  // The lone accent's text.
  EXPECT_EQ(key(29), "a .");
  EXPECT_EQ(*CompressionKey(**tokenizer, 29, CleanUpTokenizationSpaces::kYes),
            "a.");
}

TEST(CompressedVocabularyTest, IdsWithoutATokenGetTheEmptyKey) {
  absl::StatusOr<std::unique_ptr<TokenizerVocab>> tokenizer =
      TokenizerVocab::FromJson(
          MakeTokenizerJson({"a", "b", "c"}, {}, {0, 2, 4}), "test");
  ASSERT_TRUE(tokenizer.ok());
  absl::StatusOr<std::unique_ptr<CompressedVocabulary>> vocabulary =
      CompressedVocabulary::FromTokenizer(**tokenizer,
                                          CleanUpTokenizationSpaces::kNo);
  ASSERT_TRUE(vocabulary.ok());
  // len(tokenizer) is 3: ids 0, 1, 2 ("a", nothing, "b").
  EXPECT_EQ((*vocabulary)->lookup_table(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(*CompressionKey(**tokenizer, 1, CleanUpTokenizationSpaces::kNo),
            "");
}

TEST(CompressedVocabularyTest, CreateReadsTokenizerJson) {
  const std::string path = TempPath("compressed_vocabulary_test.json");
  ASSERT_TRUE(WriteFile(path, TestTokenizerJson()).ok());
  CompressedVocabularyOptions options;
  options.tokenizer_json_path = path;
  absl::StatusOr<std::unique_ptr<CompressedVocabulary>> vocabulary =
      CompressedVocabulary::Create(options);
  ASSERT_TRUE(vocabulary.ok()) << vocabulary.status();
  EXPECT_EQ((*vocabulary)->size(), 20);
  EXPECT_EQ((*vocabulary)->lookup_table(), Build()->lookup_table());

  options.tokenizer_json_path = TempPath("does_not_exist.json");
  EXPECT_EQ(CompressedVocabulary::Create(options).status().code(),
            absl::StatusCode::kNotFound);
  options.tokenizer_json_path = "";
  EXPECT_EQ(CompressedVocabulary::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string bad = TempPath("bad_tokenizer.json");
  ASSERT_TRUE(WriteFile(bad, "{\"model\": ").ok());
  options.tokenizer_json_path = bad;
  absl::StatusOr<std::unique_ptr<CompressedVocabulary>> broken =
      CompressedVocabulary::Create(options);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(broken.status().message(), bad))
      << broken.status();
}

TEST(CompressedVocabularyTest, SizeMismatchNamesExpectedAndActual) {
  const absl::Status status = Build()->CheckSize(99092);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "99092")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "20")) << status;
}

TEST(CompressedVocabularyTest, LookupOutOfRangeNamesTheToken) {
  const std::unique_ptr<CompressedVocabulary> vocabulary = Build();
  const absl::StatusOr<int64_t> past = vocabulary->Lookup(1000);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(past.status().message(), "1000"))
      << past.status();
  EXPECT_EQ(vocabulary->Lookup(-1).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(vocabulary->Lookup(vocabulary->num_tokens()).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(CompressedVocabularyTest, FromLookupTable) {
  absl::StatusOr<std::unique_ptr<CompressedVocabulary>> ok =
      CompressedVocabulary::FromLookupTable({0, 1, 0, 2, 1, 3});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->size(), 4);
  EXPECT_EQ((*ok)->num_tokens(), 6);
  EXPECT_EQ(CompressedVocabulary::FromLookupTable({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompressedVocabulary::FromLookupTable({1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompressedVocabulary::FromLookupTable({0, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CompressedVocabulary::FromLookupTable({0, -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::engram
