#include "text/tokenizer.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/text/test_tokenizers.h"
#include "text/tokenizer_json.h"

namespace mneme::text {
namespace {

using ::testing::HasSubstr;

// A small valid byte-level tokenizer.json to break in one place at a time.
nlohmann::json MinimalTokenizer() {
  return nlohmann::json::parse(R"json({
    "version": "1.0",
    "added_tokens": [
      {"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
       "rstrip": false, "normalized": false, "special": true}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                      "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3},
              "merges": ["a b"]}
  })json");
}

absl::Status Load(const nlohmann::json& spec,
                  const TokenizerOptions& options = {}) {
  return Tokenizer::FromJson(spec.dump(), options).status();
}

TEST(TokenizerTest, MinimalFileWorks) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromJson(MinimalTokenizer().dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::vector<int64_t>> ids =
      (*tokenizer)->Encode("ab<s>ba", AddSpecialTokens::kYes);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int64_t>{3, 0, 2, 1}));
  EXPECT_EQ((*tokenizer)->Decode(*ids, SkipSpecialTokens::kYes), "abba");
  EXPECT_EQ((*tokenizer)->bos_id(), 0);
  EXPECT_EQ((*tokenizer)->eos_id(), std::nullopt);
  EXPECT_EQ((*tokenizer)->vocab_size(), 4);
}

struct BadFile {
  const char* name;
  // JSON pointer of the value to replace, and its replacement (JSON).
  const char* pointer;
  const char* value;
  const char* message;
};

class BadTokenizerFileTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadTokenizerFileTest, IsInvalidArgumentNamingTheProblem) {
  const BadFile& bad = GetParam();
  nlohmann::json spec = MinimalTokenizer();
  spec[nlohmann::json::json_pointer(bad.pointer)] =
      nlohmann::json::parse(bad.value);
  const absl::Status status = Load(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(bad.message));
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.json: "));
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadTokenizerFileTest,
    ::testing::Values(
        BadFile{"ModelType", "/model/type", R"("Unigram")",
                "unsupported model type \"Unigram\""},
        BadFile{"NoVocab", "/model/vocab", "[]", "no \"vocab\" object"},
        BadFile{"NegativeId", "/model/vocab/a", "-1", "token \"a\" has id -1"},
        BadFile{"SharedId", "/model/vocab/b", "1", "share id 1"},
        BadFile{"MergeNotTwoTokens", "/model/merges", R"(["a b c"])",
                "is not two tokens separated by one space"},
        BadFile{"MergeUnknownToken", "/model/merges", R"(["a z"])",
                "names token \"z\", not in the vocab"},
        BadFile{"MergeUnknownResult", "/model/merges", R"(["b a"])",
                "makes \"ba\", not in the vocab"},
        BadFile{"MergeNotAPair", "/model/merges", R"([["a"]])",
                "merges[0] is neither"},
        BadFile{"ByteFallback", "/model/byte_fallback", "true",
                "byte_fallback is not supported"},
        BadFile{"Dropout", "/model/dropout", "0.1", "dropout 0.1"},
        BadFile{"UnknownUnk", "/model/unk_token", R"("<unk>")",
                "unk_token \"<unk>\" is not in the vocab"},
        BadFile{"Normalizer", "/normalizer", R"({"type": "BertNormalizer"})",
                "unsupported normalizer type \"BertNormalizer\""},
        BadFile{"NormalizerNoType", "/normalizer", R"({"kind": "NFC"})",
                "normalizer has no \"type\""},
        BadFile{"ReplaceNoPattern", "/normalizer",
                R"({"type": "Replace", "content": "x"})",
                "normalizer Replace needs \"pattern\""},
        BadFile{"PreTokenizer", "/pre_tokenizer", R"({"type": "Whitespace"})",
                "unsupported pre_tokenizer type \"Whitespace\""},
        BadFile{"BadRegex", "/pre_tokenizer",
                R"({"type": "Split", "pattern": {"Regex": "(ab"},
                    "behavior": "Isolated", "invert": false})",
                "regex \"(ab\" does not compile"},
        BadFile{"BadBehavior", "/pre_tokenizer",
                R"({"type": "Split", "pattern": {"String": " "},
                    "behavior": "Sideways", "invert": false})",
                "unknown behavior \"Sideways\""},
        BadFile{"BadFlag", "/pre_tokenizer/add_prefix_space", R"("yes")",
                "\"add_prefix_space\" is not a boolean"},
        BadFile{"Decoder", "/decoder", R"({"type": "WordPiece"})",
                "unsupported decoder \"WordPiece\""},
        BadFile{"PostProcessor", "/post_processor",
                R"({"type": "BertProcessing"})",
                "unsupported post_processor type \"BertProcessing\""},
        BadFile{"TemplateWithoutIds", "/post_processor",
                R"({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<s>"}},
                               {"Sequence": {"id": "A"}}],
                    "special_tokens": {}})",
                "special token without an \"ids\" entry"},
        BadFile{"AddedTokenNoContent", "/added_tokens/0",
                R"({"id": 5, "special": true})",
                "added_tokens[0] needs a string \"content\""},
        BadFile{"AddedTokenBadFlag", "/added_tokens/0/lstrip", "1",
                "added_tokens[0] field \"lstrip\" is not a boolean"},
        BadFile{"AddedTokensNotArray", "/added_tokens", "{}",
                "\"added_tokens\" is not an array"}),
    [](const ::testing::TestParamInfo<BadFile>& info) {
      return std::string(info.param.name);
    });

TEST(TokenizerTest, NotJsonAndNoModel) {
  const absl::Status not_json =
      Tokenizer::FromJson("{\"model\": ", {}, "broken.json").status();
  EXPECT_EQ(not_json.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_json.message(), HasSubstr("broken.json: "));
  EXPECT_THAT(not_json.message(), HasSubstr("malformed JSON"));
  nlohmann::json spec = MinimalTokenizer();
  spec.erase("model");
  EXPECT_THAT(Load(spec).message(), HasSubstr("no \"model\""));
}

TEST(TokenizerTest, DeeplyNestedFileIsInvalidArgument) {
  // 100k nested arrays where a normalizer belongs: parsing is iterative, but
  // copying or walking such a value overflowed the stack.
  const std::string bomb = std::string(100000, '[') + std::string(100000, ']');
  const std::string minimal = MinimalTokenizer().dump();
  for (const std::string& text :
       {absl::StrCat(R"({"normalizer": )", bomb, ",", minimal.substr(1)),
        absl::StrCat(R"({"added_tokens": [{"content": )", bomb, "}]}"),
        std::string(100000, '[')}) {
    const absl::Status status =
        Tokenizer::FromJson(text, {}, "deep/tokenizer.json").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(),
              "deep/tokenizer.json: nests arrays / objects deeper than the "
              "limit of 128");
  }
  TokenizerOptions options;
  options.tokenizer_config_json = absl::StrCat(R"({"bos_token": )", bomb, "}");
  const absl::Status config =
      Tokenizer::FromJson(minimal, options, "t.json").status();
  EXPECT_EQ(config.code(), absl::StatusCode::kInvalidArgument) << config;
  EXPECT_THAT(config.message(), HasSubstr("tokenizer_config.json: "));
  EXPECT_THAT(config.message(), HasSubstr("limit of 128"));
}

// `component` wrapped in `levels` Sequences of `type` ("normalizers" /
// "pretokenizers" lists).
nlohmann::json InSequences(nlohmann::json component, const char* list_key,
                           int levels) {
  for (int i = 0; i < levels; ++i) {
    component = nlohmann::json{{"type", "Sequence"},
                               {list_key, nlohmann::json::array({component})}};
  }
  return component;
}

TEST(TokenizerTest, SequenceNestingIsBounded) {
  const nlohmann::json lowercase = {{"type", "Lowercase"}};
  const nlohmann::json byte_level = MinimalTokenizer()["pre_tokenizer"];
  for (const int levels : {1, kMaxSequenceDepth}) {
    nlohmann::json spec = MinimalTokenizer();
    spec["normalizer"] = InSequences(lowercase, "normalizers", levels);
    spec["pre_tokenizer"] = InSequences(byte_level, "pretokenizers", levels);
    EXPECT_TRUE(Load(spec).ok()) << levels << ": " << Load(spec);
  }
  nlohmann::json spec = MinimalTokenizer();
  spec["normalizer"] =
      InSequences(lowercase, "normalizers", kMaxSequenceDepth + 1);
  absl::Status status = Load(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(
      status.message(),
      HasSubstr("normalizer Sequences nest deeper than the limit of 8"));
  spec = MinimalTokenizer();
  spec["pre_tokenizer"] = InSequences(byte_level, "pretokenizers", 60);
  status = Load(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(
      status.message(),
      HasSubstr("pre_tokenizer Sequences nest deeper than the limit of 8"));
}

TEST(TokenizerTest, MessagesQuoteLargeValuesBriefly) {
  nlohmann::json spec = MinimalTokenizer();
  spec["model"]["vocab"]["a"] = std::string(1 << 20, 'x');
  const absl::Status status = Load(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(status.message().size(), 300u) << status.message().substr(0, 300);
}

TEST(TokenizerTest, MissingFileIsNotFound) {
  const absl::Status status =
      Tokenizer::Create(absl::StrCat(std::getenv("TEST_TMPDIR"), "/none.json"))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

TEST(TokenizerTest, TokenizerConfigGivesBosAndEos) {
  TokenizerOptions options;
  options.tokenizer_config_json =
      R"({"bos_token": {"content": "b"}, "eos_token": "ab"})";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromJson(MinimalTokenizer().dump(), options);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->bos_id(), 2);
  EXPECT_EQ((*tokenizer)->eos_id(), 3);
  EXPECT_EQ((*tokenizer)->eos_token(), "ab");

  options.tokenizer_config_json = R"({"bos_token": "<nope>"})";
  const absl::Status unknown = Load(MinimalTokenizer(), options);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("bos_token \"<nope>\""));
  options.tokenizer_config_json = R"({"eos_token": 7})";
  EXPECT_EQ(Load(MinimalTokenizer(), options).code(),
            absl::StatusCode::kInvalidArgument);
  options.tokenizer_config_json = "not json";
  EXPECT_THAT(Load(MinimalTokenizer(), options).message(),
              HasSubstr("tokenizer_config.json"));
}

TEST(TokenizerTest, FindsTokenizerConfigBesideTheFile) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream(dir + "/tokenizer.json") << MinimalTokenizer().dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "b"})";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::Create(dir + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->eos_id(), 2);
}

TEST(TokenizerTest, BosAndEosOfTheTestFiles) {
  const struct {
    const char* name;
    std::optional<int64_t> bos;
    std::optional<int64_t> eos;
  } cases[] = {
      {"synthetic", 0, 1},              // Well-known DeepSeek names.
      {"deepseek_style", 0, 1},         // tokenizer_config.json.
      {"gpt2_style", std::nullopt, 0},  // <|endoftext|>.
      {"llama3_style", 0, 1084},        // Template; <|end_of_text|>.
      {"wordpiece_style", std::nullopt, std::nullopt},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        LoadTestTokenizer(c.name);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    EXPECT_EQ((*tokenizer)->bos_id(), c.bos) << c.name;
    EXPECT_EQ((*tokenizer)->eos_id(), c.eos) << c.name;
  }
}

TEST(TokenizerTest, RejectsTextThatIsNotUtf8) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("synthetic");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (const char* bad : {"a\xFF", "\xC3", "\xED\xA0\x80", "\xC0\xAF"}) {
    EXPECT_EQ((*tokenizer)->Encode(bad, AddSpecialTokens::kNo).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Long runs of one kind of character make single huge words: encoding stays
// near-linear (this would not finish in time if it were quadratic).
TEST(TokenizerTest, LongRunsRoundTrip) {
  for (const char* name : {"synthetic", "deepseek_style"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        LoadTestTokenizer(name);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    std::string mixed;
    for (int i = 0; i < 20000; ++i) mixed += i % 7 == 0 ? "\n" : " \t";
    for (const std::string& text :
         {std::string(1000000, ' '), std::string(100000, 'a'),
          std::string(100000, '\n'), mixed,
          absl::StrCat("x", std::string(100000, ' '), "y")}) {
      absl::StatusOr<std::vector<int64_t>> ids =
          (*tokenizer)->Encode(text, AddSpecialTokens::kNo);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_LE(ids->size(), text.size());
      EXPECT_EQ((*tokenizer)->Decode(*ids, SkipSpecialTokens::kNo), text)
          << name;
    }
  }
}

TEST(TokenizerTest, ConcurrentEncodesAgreeWithSequentialOnes) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("deepseek_style");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const nlohmann::json expected =
      nlohmann::json::parse(ReadTestdata("deepseek_style.expected.json"));
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (const nlohmann::json& c : expected["cases"]) {
          absl::StatusOr<std::vector<int64_t>> ids =
              (*tokenizer)
                  ->Encode(c["text"].get<std::string>(),
                           AddSpecialTokens::kYes);
          if (!ids.ok() ||
              *ids != c["ids_with_special"].get<std::vector<int64_t>>()) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

TEST(TokenizerTest, UncachedEncodingMatches) {
  TokenizerOptions options;
  options.bpe.cache_capacity = 0;
  absl::StatusOr<std::unique_ptr<Tokenizer>> uncached =
      Tokenizer::Create(TestdataPath("deepseek_style.json"), options);
  options.bpe.cache_capacity = 3;  // Emptied again and again.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tiny =
      Tokenizer::Create(TestdataPath("deepseek_style.json"), options);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  const nlohmann::json expected =
      nlohmann::json::parse(ReadTestdata("deepseek_style.expected.json"));
  for (const nlohmann::json& c : expected["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(*(*uncached)->Encode(text, AddSpecialTokens::kNo),
              c["ids"].get<std::vector<int64_t>>());
    EXPECT_EQ(*(*tiny)->Encode(text, AddSpecialTokens::kNo),
              c["ids"].get<std::vector<int64_t>>());
  }
}

}  // namespace
}  // namespace mneme::text
