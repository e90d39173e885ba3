#include "checkpoint/sharded_checkpoint.h"

#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::PatternBytes;
using ::mneme::checkpoint::testing::WriteFileOrFail;
using ::mneme::checkpoint::testing::WritePatternFile;
using ::testing::HasSubstr;

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

// Two shards: a, b in shard 1; c (and d, not indexed) in shard 2.
std::string MakeShardedDir() {
  std::string dir = MakeTempDir();
  WritePatternFile(dir + "/" + kShard1,
                   {{"a", DType::kF32, {2}}, {"b", DType::kU8, {3}}}, 10);
  WritePatternFile(dir + "/" + kShard2,
                   {{"c", DType::kI64, {1}}, {"d", DType::kU8, {1}}}, 20);
  CheckpointIndex index;
  index.total_size = 8 + 3 + 8;
  index.weight_map = {{"a", kShard1}, {"b", kShard1}, {"c", kShard2}};
  EXPECT_TRUE(
      WriteCheckpointIndex(dir + "/model.safetensors.index.json", index).ok());
  return dir;
}

TEST(ShardedCheckpointTest, OpensIndexedShards) {
  const std::string dir = MakeShardedDir();
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->shards().size(), 2u);
  ASSERT_TRUE((*checkpoint)->index().has_value());
  EXPECT_EQ((*checkpoint)->index()->total_size, 19u);
  EXPECT_EQ((*checkpoint)->tensors().size(), 3u);

  absl::StatusOr<TensorLocation> c = (*checkpoint)->Find("c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard->path(), dir + "/" + kShard2);
  EXPECT_EQ(c->info->dtype, DType::kI64);
  EXPECT_EQ(*c->shard->ReadTensor("c"), PatternBytes(8, 20));

  absl::StatusOr<TensorLocation> b = (*checkpoint)->Find("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->shard->path(), dir + "/" + kShard1);

  // Present in a shard but not in the index: not visible.
  absl::StatusOr<TensorLocation> d = (*checkpoint)->Find("d");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(), HasSubstr("'d'"));
  EXPECT_THAT(d.status().message(), HasSubstr(dir));
  EXPECT_EQ((*checkpoint)->FindOrNull("d"), nullptr);
}

TEST(ShardedCheckpointTest, OpensSingleFileCheckpoint) {
  const std::string dir = MakeTempDir();
  WritePatternFile(dir + "/model.safetensors",
                   {{"x", DType::kBf16, {4}}, {"y", DType::kF16, {2}}}, 0);
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir + "/");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_FALSE((*checkpoint)->index().has_value());
  EXPECT_EQ((*checkpoint)->shards().size(), 1u);
  EXPECT_EQ((*checkpoint)->tensors().size(), 2u);
  absl::StatusOr<TensorLocation> y = (*checkpoint)->Find("y");
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->shard->path(), dir + "/model.safetensors");
}

TEST(ShardedCheckpointTest, EmptyOrMissingDirectoryIsNotFound) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(dir));
  EXPECT_EQ(ShardedCheckpoint::Create(dir + "/nope").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ShardedCheckpointTest, MissingShardIsDataLossNamingIndexAndShard) {
  const std::string dir = MakeShardedDir();
  ASSERT_EQ(unlink((dir + "/" + kShard2).c_str()), 0);
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("model.safetensors.index.json"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(kShard2));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("'c'"));
}

TEST(ShardedCheckpointTest, TensorAbsentFromShardIsDataLossNamingBoth) {
  const std::string dir = MakeShardedDir();
  CheckpointIndex index;
  index.weight_map = {{"a", kShard1},
                      {"layers.1.engram.embed.weight", kShard1}};
  ASSERT_TRUE(
      WriteCheckpointIndex(dir + "/model.safetensors.index.json", index).ok());
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("layers.1.engram.embed.weight"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(kShard1));
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("model.safetensors.index.json"));
}

TEST(ShardedCheckpointTest, CorruptShardIsDataLossNamingShard) {
  const std::string dir = MakeShardedDir();
  WriteFileOrFail(dir + "/" + kShard1, "short");
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(kShard1));
}

TEST(ShardedCheckpointTest, CorruptIndexIsDataLoss) {
  const std::string dir = MakeShardedDir();
  WriteFileOrFail(dir + "/model.safetensors.index.json", "{\"weight_map\":");
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("model.safetensors.index.json"));
}

}  // namespace
}  // namespace mneme::checkpoint
