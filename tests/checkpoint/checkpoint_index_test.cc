#include "checkpoint/checkpoint_index.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::WriteFileOrFail;
using ::testing::HasSubstr;

constexpr char kFile[] = "ckpt/model.safetensors.index.json";

TEST(CheckpointIndexTest, ParsesHuggingFaceIndex) {
  absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(
      R"({
        "metadata": {"total_size": 202760000000, "format": "pt"},
        "weight_map": {
          "layers.1.engram.embed.weight": "model-00047-of-00048.safetensors",
          "layers.1.engram.embed.scale": "model-00047-of-00048.safetensors",
          "embed.weight": "sub/model-00001-of-00048.safetensors"
        },
        "extra": true
      })",
      kFile);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_TRUE(index->total_size.has_value());
  EXPECT_EQ(*index->total_size, 202760000000u);
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->weight_map.at("embed.weight"),
            "sub/model-00001-of-00048.safetensors");
}

TEST(CheckpointIndexTest, MetadataIsOptional) {
  absl::StatusOr<CheckpointIndex> index =
      ParseCheckpointIndex(R"({"weight_map": {}})", kFile);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_FALSE(index->total_size.has_value());
  index =
      ParseCheckpointIndex(R"({"metadata": null, "weight_map": {}})", kFile);
  ASSERT_TRUE(index.ok()) << index.status();
}

TEST(CheckpointIndexTest, BadIndexesAreDataLoss) {
  struct Case {
    std::string json;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {"[]", "not a JSON object"},
      {R"({"metadata": {}})", "missing \"weight_map\""},
      {R"({"weight_map": []})", "\"weight_map\" is not an object"},
      {R"({"weight_map": {"t.a": 3}})", "t.a"},
      {R"({"weight_map": {"t.b": ""}})", "t.b"},
      {R"({"weight_map": {"t.c": "/abs/shard.safetensors"}})", "t.c"},
      {R"({"weight_map": {"t.d": "../up.safetensors"}})", "t.d"},
      {R"({"weight_map": {"t.e": "a/../../up.safetensors"}})", "t.e"},
      {R"({"weight_map": {"t.f": "x", "t.f": "y"}})", "t.f"},
      {R"({"metadata": [], "weight_map": {}})", "metadata"},
      {R"({"metadata": {"total_size": -1}, "weight_map": {}})", "total_size"},
      {R"({"metadata": {"total_size": "12"}, "weight_map": {}})", "total_size"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(c.json, kFile);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss) << c.json;
    EXPECT_THAT(index.status().message(), HasSubstr(kFile));
    EXPECT_THAT(index.status().message(), HasSubstr(c.want));
  }
}

TEST(CheckpointIndexTest, WriteThenReadRoundTrips) {
  const std::string path = MakeTempDir() + "/model.safetensors.index.json";
  CheckpointIndex index;
  index.total_size = 12345;
  index.weight_map = {{"a", "model-00001-of-00002.safetensors"},
                      {"b", "model-00002-of-00002.safetensors"}};
  ASSERT_TRUE(WriteCheckpointIndex(path, index).ok());
  absl::StatusOr<CheckpointIndex> read = ReadCheckpointIndex(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->total_size, index.total_size);
  EXPECT_EQ(read->weight_map, index.weight_map);

  index.total_size.reset();
  ASSERT_TRUE(WriteCheckpointIndex(path, index).ok());
  read = ReadCheckpointIndex(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->total_size.has_value());
}

TEST(CheckpointIndexTest, SerializedFormIsHuggingFaceShaped) {
  CheckpointIndex index;
  index.total_size = 7;
  index.weight_map = {{"w", "s.safetensors"}};
  absl::StatusOr<std::string> text = SerializeCheckpointIndex(index);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "{\n  \"metadata\": {\n    \"total_size\": 7\n  },\n"
            "  \"weight_map\": {\n    \"w\": \"s.safetensors\"\n  }\n}\n");
}

TEST(CheckpointIndexTest, InvalidUtf8NameIsInvalidArgument) {
  CheckpointIndex index;
  index.weight_map = {{"bad\xff", "s.safetensors"}};
  EXPECT_EQ(SerializeCheckpointIndex(index).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointIndexTest, MissingAndCorruptFiles) {
  const std::string dir = MakeTempDir();
  EXPECT_EQ(ReadCheckpointIndex(dir + "/absent.json").status().code(),
            absl::StatusCode::kNotFound);
  WriteFileOrFail(dir + "/bad.json", "{\"weight_map\": ");
  absl::StatusOr<CheckpointIndex> index =
      ReadCheckpointIndex(dir + "/bad.json");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(index.status().message(), HasSubstr(dir + "/bad.json"));
}

}  // namespace
}  // namespace mneme::checkpoint
