#include "checkpoint/engram_config_loader.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::WriteFileOrFail;
using ::testing::HasSubstr;

constexpr char kFile[] = "v41/config.json";

// The Engram keys of DeepSeek-V4.1-Flash (ENGRAM.md), without braces.
constexpr char kV41Keys[] = R"(
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_vocab_size": 16000000,
    "engram_compressed_vocab_size": 99092,
    "engram_pad_token_id": 2)";

constexpr char kNvfp4Keys[] = R"(,
    "engram_quant": "nvfp4",
    "engram_quant_block_size": 16,
    "engram_quant_method": "gptq-mse",
    "engram_quant_global_scale": {"1": 0.0123, "14": 2.5e-3})";

absl::StatusOr<EngramConfig> Parse(const std::string& json) {
  absl::StatusOr<std::unique_ptr<ModelConfig>> config =
      ModelConfig::Parse(json, kFile);
  if (!config.ok()) return config.status();
  return ParseEngramConfig(**config);
}

std::string Nested(const std::string& keys) {
  return R"({"architectures": ["DeepseekV4"], "text_config": {)" + keys + "}}";
}

void ExpectV41(const EngramConfig& config) {
  EXPECT_EQ(config.layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(config.num_embeddings,
            (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(config.max_ngram_size, 4);
  EXPECT_EQ(config.n_heads, 8);
  EXPECT_EQ(config.head_dim, 256);
  EXPECT_EQ(config.vocab_size, 16000000);
  EXPECT_EQ(config.compressed_vocab_size, 99092);
  EXPECT_EQ(config.pad_token_id, 2);
  EXPECT_EQ(config.NumColumns(), 24);
}

TEST(EngramConfigLoaderTest, ParsesTextConfigNesting) {
  absl::StatusOr<EngramConfig> config = Parse(Nested(kV41Keys));
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectV41(*config);
  EXPECT_EQ(config->format, formats::RowFormat::kFp8);
  EXPECT_TRUE(config->global_scales.empty());
}

TEST(EngramConfigLoaderTest, ParsesTopLevel) {
  absl::StatusOr<EngramConfig> config =
      Parse(std::string("{") + kV41Keys + "}");
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectV41(*config);
}

TEST(EngramConfigLoaderTest, ParsesNvfp4Keys) {
  absl::StatusOr<EngramConfig> config =
      Parse(Nested(std::string(kV41Keys) + kNvfp4Keys));
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectV41(*config);
  EXPECT_EQ(config->format, formats::RowFormat::kNvfp4);
  EXPECT_EQ(config->quant_block_size, 16);
  EXPECT_EQ(config->quant_method, "gptq-mse");
  ASSERT_EQ(config->global_scales.size(), 2u);
  EXPECT_EQ(config->global_scales.at(1), 0.0123f);
  EXPECT_EQ(config->global_scales.at(14), 2.5e-3f);
}

TEST(EngramConfigLoaderTest, Nvfp4KeysMayBeSplitAcrossSections) {
  // Quantization keys at the top level, model keys under text_config.
  absl::StatusOr<EngramConfig> config =
      Parse(R"({"engram_quant": "nvfp4", "engram_quant_global_scale":
                {"1": 1, "14": 2}, "text_config": {)" +
            std::string(kV41Keys) + "}}");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->format, formats::RowFormat::kNvfp4);
  EXPECT_EQ(config->global_scales.at(14), 2.0f);
  EXPECT_EQ(config->quant_block_size, 16);  // Default.
  EXPECT_TRUE(config->quant_method.empty());
}

TEST(EngramConfigLoaderTest, ExplicitFp8AndNullQuant) {
  absl::StatusOr<EngramConfig> config =
      Parse(Nested(std::string(kV41Keys) + R"(, "engram_quant": "fp8")"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->format, formats::RowFormat::kFp8);
  config = Parse(Nested(std::string(kV41Keys) + R"(, "engram_quant": null)"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->format, formats::RowFormat::kFp8);
}

TEST(EngramConfigLoaderTest, LoadsFromFile) {
  const std::string path = MakeTempDir() + "/config.json";
  WriteFileOrFail(path, Nested(kV41Keys));
  absl::StatusOr<EngramConfig> config = LoadEngramConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  ExpectV41(*config);
  absl::StatusOr<EngramConfig> missing = LoadEngramConfig(path + ".absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// Every required key, when removed, is reported by name.
class MissingKeyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MissingKeyTest, IsInvalidArgumentNamingKeyAndFile) {
  const std::string key = GetParam();
  std::string keys = kV41Keys;
  // Replace the key's name so that it is absent.
  keys = absl::StrReplaceAll(keys, {{"\"" + key + "\"", "\"renamed\""}});
  absl::StatusOr<EngramConfig> config = Parse(Nested(keys));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr(key));
  EXPECT_THAT(config.status().message(), HasSubstr(kFile));
  EXPECT_THAT(config.status().message(), HasSubstr("missing"));
}

INSTANTIATE_TEST_SUITE_P(
    RequiredKeys, MissingKeyTest,
    ::testing::Values("engram_layer_ids", "engram_num_embeddings",
                      "engram_max_ngram_size", "engram_n_heads",
                      "engram_head_dim", "engram_vocab_size",
                      "engram_compressed_vocab_size", "engram_pad_token_id"));

// A replacement of part of the V4.1 keys that makes them invalid.
struct BadValue {
  const char* label;
  std::string from;
  std::string to;
  std::string want;  // In the message, besides the file name.
};

void PrintTo(const BadValue& bad, std::ostream* os) { *os << bad.label; }

class BadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(BadValueTest, IsInvalidArgument) {
  const BadValue& bad = GetParam();
  const std::string keys = std::string(kV41Keys) + kNvfp4Keys;
  ASSERT_NE(keys.find(bad.from), std::string::npos) << bad.from;
  absl::StatusOr<EngramConfig> config =
      Parse(Nested(absl::StrReplaceAll(keys, {{bad.from, bad.to}})));
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
      << bad.label << ": " << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr(bad.want));
  EXPECT_THAT(config.status().message(), HasSubstr(kFile));
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadValueTest,
    ::testing::Values(
        BadValue{"layer ids not array", "[1, 14]", "14",
                 "text_config.engram_layer_ids"},
        BadValue{"layer id string", "[1, 14]", "[1, \"14\"]",
                 "engram_layer_ids"},
        BadValue{"layer id negative", "[1, 14]", "[-1, 14]",
                 "engram_layer_ids"},
        BadValue{"layer ids empty", "[1, 14]", "[]", "engram_layer_ids"},
        BadValue{"layer ids descending", "[1, 14]", "[14, 1]",
                 "engram_layer_ids"},
        BadValue{"length mismatch", "[384006168, 384016682]", "[384006168]",
                 "engram_num_embeddings"},
        BadValue{"zero rows", "[384006168, 384016682]", "[0, 384016682]",
                 "engram_num_embeddings"},
        BadValue{"rows float", "[384006168, 384016682]",
                 "[384006168.5, 384016682]", "engram_num_embeddings"},
        BadValue{"ngram wrong type", "\"engram_max_ngram_size\": 4",
                 "\"engram_max_ngram_size\": \"4\"", "engram_max_ngram_size"},
        BadValue{"ngram too small", "\"engram_max_ngram_size\": 4",
                 "\"engram_max_ngram_size\": 1", "engram_max_ngram_size"},
        BadValue{"heads zero", "\"engram_n_heads\": 8", "\"engram_n_heads\": 0",
                 "engram_n_heads"},
        BadValue{"head dim", "\"engram_head_dim\": 256",
                 "\"engram_head_dim\": 128", "engram_head_dim"},
        BadValue{"vocab float", "\"engram_vocab_size\": 16000000",
                 "\"engram_vocab_size\": 1.6e7", "engram_vocab_size"},
        BadValue{"compressed vocab zero", "99092", "0",
                 "engram_compressed_vocab_size"},
        BadValue{"pad negative", "\"engram_pad_token_id\": 2",
                 "\"engram_pad_token_id\": -2", "engram_pad_token_id"},
        BadValue{"quant unknown", "\"nvfp4\"", "\"int4\"", "engram_quant"},
        BadValue{"quant not string", "\"nvfp4\"", "4", "engram_quant"},
        BadValue{"block size", "\"engram_quant_block_size\": 16",
                 "\"engram_quant_block_size\": 32", "engram_quant_block_size"},
        BadValue{"method not string", "\"gptq-mse\"", "7",
                 "engram_quant_method"},
        BadValue{"global scale missing for a layer", "\"14\": 2.5e-3",
                 "\"15\": 2.5e-3", "no scale for layer 14"},
        BadValue{"global scale missing", "\"engram_quant_global_scale\"",
                 "\"other_scale\"", "engram_quant_global_scale"},
        BadValue{"global scale not object", "{\"1\": 0.0123, \"14\": 2.5e-3}",
                 "[0.0123, 2.5e-3]", "engram_quant_global_scale"},
        BadValue{"global scale string", "\"14\": 2.5e-3", "\"14\": \"x\"",
                 "layer 14"},
        BadValue{"global scale zero", "\"14\": 2.5e-3", "\"14\": 0",
                 "layer 14"},
        BadValue{"global scale negative", "\"14\": 2.5e-3", "\"14\": -1.0",
                 "layer 14"},
        BadValue{"global scale beyond fp32", "\"14\": 2.5e-3", "\"14\": 1e39",
                 "layer 14"},
        BadValue{"global scale underflows fp32", "\"14\": 2.5e-3",
                 "\"14\": 1e-50", "layer 14"}),
    [](const ::testing::TestParamInfo<BadValue>& info) {
      std::string name = info.param.label;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace mneme::checkpoint
