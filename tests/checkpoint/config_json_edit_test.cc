#include "checkpoint/config_json_edit.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::WriteFileOrFail;
using ::testing::HasSubstr;

void SetQuant(nlohmann::ordered_json& section) {
  section["quant"] = "nvfp4";
  section.erase("drop");
}

TEST(EditConfigJsonTextTest, KeepsKeyOrderAndEditsTopLevel) {
  absl::StatusOr<std::string> text = EditConfigJsonText(
      R"({"z": 1, "drop": true, "a": [1, 2]})", "c.json", "", SetQuant);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "{\n  \"z\": 1,\n  \"a\": [\n    1,\n    2\n  ],\n"
            "  \"quant\": \"nvfp4\"\n}\n");
}

TEST(EditConfigJsonTextTest, EditsTextConfigWhenItHoldsTheMarker) {
  const std::string source = R"({"text_config": {"layers": 2}, "vision": 1})";
  absl::StatusOr<std::string> with_marker =
      EditConfigJsonText(source, "c.json", "layers", SetQuant);
  ASSERT_TRUE(with_marker.ok()) << with_marker.status();
  EXPECT_EQ(*with_marker,
            "{\n  \"text_config\": {\n    \"layers\": 2,\n"
            "    \"quant\": \"nvfp4\"\n  },\n  \"vision\": 1\n}\n");
  absl::StatusOr<std::string> no_marker =
      EditConfigJsonText(source, "c.json", "engram_layer_ids", SetQuant);
  ASSERT_TRUE(no_marker.ok()) << no_marker.status();
  EXPECT_EQ(*no_marker,
            "{\n  \"text_config\": {\n    \"layers\": 2\n  },\n"
            "  \"vision\": 1,\n  \"quant\": \"nvfp4\"\n}\n");
  absl::StatusOr<std::string> any =
      EditConfigJsonText(source, "c.json", "", SetQuant);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(*any, *with_marker);
}

TEST(EditConfigJsonTextTest, RejectsWhatIsNotAnObject) {
  for (const char* bad : {"[1]", "{\"a\":", ""}) {
    absl::StatusOr<std::string> text =
        EditConfigJsonText(bad, "ckpt/config.json", "", SetQuant);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_THAT(text.status().message(), HasSubstr("ckpt/config.json"));
  }
}

TEST(EditConfigJsonTextTest, RejectsDeepNestingBeforeWritingItBack) {
  // Writing such a document back recursed once per level.
  const std::string bomb =
      "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  absl::StatusOr<std::string> text =
      EditConfigJsonText(bomb, "ckpt/config.json", "", SetQuant);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(),
              HasSubstr("'ckpt/config.json' nests arrays / objects deeper "
                        "than the limit of 128"));
}

TEST(EditConfigJsonTest, ReadsTheCheckpointsConfig) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::string> missing = EditConfigJson(dir, "", SetQuant);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  WriteFileOrFail(dir + "/config.json", R"({"b": 1})");
  absl::StatusOr<std::string> text = EditConfigJson(dir, "", SetQuant);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\n  \"b\": 1,\n  \"quant\": \"nvfp4\"\n}\n");
}

}  // namespace
}  // namespace mneme::checkpoint
