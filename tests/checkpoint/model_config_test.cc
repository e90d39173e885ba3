#include "checkpoint/model_config.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::WriteFileOrFail;
using ::testing::HasSubstr;

constexpr char kFile[] = "ckpt/config.json";

TEST(ModelConfigTest, TextConfigWinsOverTopLevel) {
  absl::StatusOr<std::unique_ptr<ModelConfig>> config = ModelConfig::Parse(
      R"({"hidden_size": 1, "model_type": "outer", "vocab_size": 5,
          "text_config": {"hidden_size": 4096, "rms_norm_eps": 1e-6,
                          "tie": false, "rope_scaling": {"factor": 4}}})",
      kFile);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE((*config)->has_text_config());
  EXPECT_EQ(*(*config)->GetInt("hidden_size"), 4096);
  EXPECT_EQ((*config)->KeyPath("hidden_size"), "text_config.hidden_size");
  EXPECT_EQ(*(*config)->GetInt("vocab_size"), 5);  // Falls back.
  EXPECT_EQ((*config)->KeyPath("vocab_size"), "vocab_size");
  EXPECT_EQ(*(*config)->GetString("model_type"), "outer");
  EXPECT_DOUBLE_EQ(*(*config)->GetDouble("rms_norm_eps"), 1e-6);
  EXPECT_DOUBLE_EQ(*(*config)->GetDouble("hidden_size"), 4096.0);
  EXPECT_FALSE(*(*config)->GetBool("tie"));
  const nlohmann::json* rope = (*config)->Find("rope_scaling");
  ASSERT_NE(rope, nullptr);
  EXPECT_TRUE(rope->is_object());
  EXPECT_TRUE((*config)->root().contains("text_config"));
}

TEST(ModelConfigTest, GetterErrorsNameKeyAndFile) {
  absl::StatusOr<std::unique_ptr<ModelConfig>> config = ModelConfig::Parse(
      R"({"text_config": {"n": "four", "big": 18446744073709551615,
                          "nothing": null}})",
      kFile);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<int64_t> n = (*config)->GetInt("n");
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("text_config.n"));
  EXPECT_THAT(n.status().message(), HasSubstr(kFile));
  absl::StatusOr<int64_t> big = (*config)->GetInt("big");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> missing = (*config)->GetString("absent_key");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("absent_key"));
  EXPECT_THAT(missing.status().message(), HasSubstr("missing"));
  // JSON null counts as absent.
  EXPECT_EQ((*config)->Find("nothing"), nullptr);
  EXPECT_EQ((*config)->GetBool("n").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*config)->GetDouble("n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, RangedIntegersAndIntegerArrays) {
  absl::StatusOr<std::unique_ptr<ModelConfig>> config = ModelConfig::Parse(
      R"({"text_config": {"n": 7, "ids": [1, 2, 9], "bad": [1, "x"],
                          "one": 3}})",
      kFile);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*(*config)->GetIntInRange("n", 0, 7), 7);
  absl::StatusOr<int64_t> n = (*config)->GetIntInRange("n", 0, 6);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("text_config.n"));
  EXPECT_THAT(n.status().message(), HasSubstr("7 is outside [0, 6]"));

  EXPECT_THAT(*(*config)->GetIntArray("ids", 0, 9),
              ::testing::ElementsAre(1, 2, 9));
  absl::StatusOr<std::vector<int64_t>> ids =
      (*config)->GetIntArray("ids", 0, 8);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("element 2 (9)"));
  EXPECT_THAT((*config)->GetIntArray("bad", 0, 8).status().message(),
              HasSubstr("element 1 is not an integer"));
  EXPECT_THAT((*config)->GetIntArray("one", 0, 8).status().message(),
              HasSubstr("not an array"));
  EXPECT_THAT((*config)->GetIntArray("absent", 0, 8).status().message(),
              HasSubstr("missing"));
}

TEST(ModelConfigTest, BadDocuments) {
  EXPECT_EQ(ModelConfig::Parse("{", kFile).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ModelConfig::Parse(R"({"a": 1, "a": 2})", kFile).status().code(),
            absl::StatusCode::kDataLoss);
  absl::StatusOr<std::unique_ptr<ModelConfig>> config =
      ModelConfig::Parse("[1]", kFile);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr(kFile));
  config = ModelConfig::Parse(R"({"text_config": 3})", kFile);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("text_config"));
}

TEST(ModelConfigTest, DeeplyNestedConfigIsInvalidArgument) {
  const std::string bomb = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& text :
       {absl::StrCat(R"({"vocab_size": 8, "rope_scaling": )", bomb, "}"),
        std::string(100000, '{')}) {
    const absl::Status status = ModelConfig::Parse(text, kFile).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(),
              absl::StrCat("config '", kFile,
                           "' nests arrays / objects deeper than the limit "
                           "of 128"));
  }
}

TEST(ModelConfigTest, CreateReadsFile) {
  const std::string dir = MakeTempDir();
  WriteFileOrFail(dir + "/config.json", R"({"num_hidden_layers": 43})");
  absl::StatusOr<std::unique_ptr<ModelConfig>> config =
      ModelConfig::Create(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE((*config)->has_text_config());
  EXPECT_EQ((*config)->file_name(), dir + "/config.json");
  EXPECT_EQ(*(*config)->GetInt("num_hidden_layers"), 43);
  EXPECT_EQ(ModelConfig::Create(dir + "/absent.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mneme::checkpoint
