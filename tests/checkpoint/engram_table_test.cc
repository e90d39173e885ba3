#include "checkpoint/engram_table.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/file_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::PatternBytes;
using ::mneme::checkpoint::testing::WritePatternFile;
using ::testing::HasSubstr;

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";
constexpr int64_t kRows1 = 37;
constexpr int64_t kRows14 = 53;

EngramConfig MakeConfig(formats::RowFormat format) {
  EngramConfig config;
  config.layer_ids = {1, 14};
  config.num_embeddings = {kRows1, kRows14};
  config.format = format;
  if (format == formats::RowFormat::kNvfp4)
    config.global_scales = {{1, 0.5f}, {14, 2.0f}};
  return config;
}

std::vector<TensorDecl> TableDecls(int layer, int64_t rows,
                                   formats::RowFormat format) {
  const bool fp8 = format == formats::RowFormat::kFp8;
  return {
      {"layers." + std::to_string(layer) + ".engram.q_weight",
       DType::kBf16,
       {4, 8}},
      {EngramWeightTensorName(layer),
       fp8 ? DType::kF8E4M3 : DType::kU8,
       {rows, fp8 ? 256 : 128}},
      {EngramScaleTensorName(layer),
       fp8 ? DType::kF8E8M0 : DType::kF8E4M3,
       {rows, fp8 ? 8 : 16}},
  };
}

// Layer 1's table in shard 1, layer 14's in shard 2, each after another
// tensor so that offsets are not trivially the data start. `edit` may change
// the declarations of layer 14 before they are written.
std::string MakeCheckpoint(
    formats::RowFormat format,
    void (*edit)(std::vector<TensorDecl>&) = [](std::vector<TensorDecl>&) {}) {
  std::string dir = MakeTempDir();
  WritePatternFile(dir + "/" + kShard1, TableDecls(1, kRows1, format), 100);
  std::vector<TensorDecl> decls14 = TableDecls(14, kRows14, format);
  edit(decls14);
  WritePatternFile(dir + "/" + kShard2, decls14, 200);
  CheckpointIndex index;
  for (const TensorDecl& d : TableDecls(1, kRows1, format)) {
    index.weight_map[d.name] = kShard1;
  }
  for (const TensorDecl& d : decls14) index.weight_map[d.name] = kShard2;
  EXPECT_TRUE(
      WriteCheckpointIndex(dir + "/model.safetensors.index.json", index).ok());
  return dir;
}

std::unique_ptr<ShardedCheckpoint> Open(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  return checkpoint.ok() ? *std::move(checkpoint) : nullptr;
}

std::vector<uint8_t> Pread(const std::string& path, uint64_t offset,
                           size_t size) {
  std::vector<uint8_t> out(size);
  absl::StatusOr<ScopedFd> fd = OpenForRead(path);
  EXPECT_TRUE(fd.ok());
  EXPECT_TRUE(PreadFully(fd->get(), offset, absl::MakeSpan(out), path).ok());
  return out;
}

class EngramTableFormatTest
    : public ::testing::TestWithParam<formats::RowFormat> {};

TEST_P(EngramTableFormatTest, LocatesRowsOfEveryLayer) {
  const formats::RowFormat format = GetParam();
  const std::string dir = MakeCheckpoint(format);
  std::unique_ptr<ShardedCheckpoint> checkpoint = Open(dir);
  ASSERT_NE(checkpoint, nullptr);
  absl::StatusOr<std::vector<EngramTableLocation>> tables =
      LocateEngramTables(*checkpoint, MakeConfig(format));
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 2u);

  const uint32_t seeds[] = {100, 200};
  const int64_t rows[] = {kRows1, kRows14};
  const char* shards[] = {kShard1, kShard2};
  for (size_t t = 0; t < 2; ++t) {
    const EngramTableLocation& table = (*tables)[t];
    EXPECT_EQ(table.layer, t == 0 ? 1 : 14);
    EXPECT_EQ(table.format, format);
    EXPECT_EQ(table.rows, rows[t]);
    EXPECT_EQ(table.shard_path, dir + "/" + shards[t]);
    EXPECT_EQ(table.scale_shard_path, table.shard_path);
    EXPECT_EQ(table.weight_row_bytes, formats::RowWeightBytes(format));
    EXPECT_EQ(table.scale_row_bytes, formats::RowScaleBytes(format));
    EXPECT_EQ(table.global_scale, format == formats::RowFormat::kNvfp4
                                      ? (t == 0 ? 0.5f : 2.0f)
                                      : 1.0f);
    // Rows read at the computed offsets are the rows that were written.
    const std::vector<uint8_t> weight =
        PatternBytes(rows[t] * table.weight_row_bytes, seeds[t] + 1);
    const std::vector<uint8_t> scale =
        PatternBytes(rows[t] * table.scale_row_bytes, seeds[t] + 2);
    for (int64_t r : {int64_t{0}, int64_t{5}, rows[t] - 1}) {
      const uint64_t wb = table.weight_row_bytes;
      const uint64_t sb = table.scale_row_bytes;
      EXPECT_EQ(Pread(table.shard_path, table.weight_offset + r * wb, wb),
                std::vector<uint8_t>(weight.begin() + r * wb,
                                     weight.begin() + (r + 1) * wb));
      EXPECT_EQ(Pread(table.scale_shard_path, table.scale_offset + r * sb, sb),
                std::vector<uint8_t>(scale.begin() + r * sb,
                                     scale.begin() + (r + 1) * sb));
    }
  }
}

TEST_P(EngramTableFormatTest, FormatMismatchIsDataLossNamingFileAndTensor) {
  const formats::RowFormat format = GetParam();
  const formats::RowFormat other = format == formats::RowFormat::kFp8
                                       ? formats::RowFormat::kNvfp4
                                       : formats::RowFormat::kFp8;
  const std::string dir = MakeCheckpoint(format);
  std::unique_ptr<ShardedCheckpoint> checkpoint = Open(dir);
  ASSERT_NE(checkpoint, nullptr);
  absl::StatusOr<EngramTableLocation> table =
      LocateEngramTable(*checkpoint, MakeConfig(other), 1);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(table.status().message(), HasSubstr(kShard1));
  EXPECT_THAT(table.status().message(),
              HasSubstr("layers.1.engram.embed.weight"));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, EngramTableFormatTest,
    ::testing::Values(formats::RowFormat::kFp8, formats::RowFormat::kNvfp4),
    [](const ::testing::TestParamInfo<formats::RowFormat>& info) {
      return std::string(formats::RowFormatName(info.param));
    });

void ExpectDataLoss(const std::string& dir, const std::string& tensor,
                    const std::string& want) {
  std::unique_ptr<ShardedCheckpoint> checkpoint = Open(dir);
  ASSERT_NE(checkpoint, nullptr);
  absl::StatusOr<EngramTableLocation> table =
      LocateEngramTable(*checkpoint, MakeConfig(formats::RowFormat::kFp8), 14);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kDataLoss)
      << table.status();
  EXPECT_THAT(table.status().message(), HasSubstr(kShard2));
  EXPECT_THAT(table.status().message(), HasSubstr(tensor));
  EXPECT_THAT(table.status().message(), HasSubstr(want));
}

TEST(EngramTableTest, WrongScaleDtypeIsDataLoss) {
  ExpectDataLoss(MakeCheckpoint(formats::RowFormat::kFp8,
                                [](std::vector<TensorDecl>& d) {
                                  d[2].dtype = DType::kU8;
                                }),
                 "layers.14.engram.embed.scale", "F8_E8M0 [53, 8]");
}

TEST(EngramTableTest, WrongRowWidthIsDataLoss) {
  ExpectDataLoss(MakeCheckpoint(formats::RowFormat::kFp8,
                                [](std::vector<TensorDecl>& d) {
                                  d[1].shape = {kRows14, 255};
                                }),
                 "layers.14.engram.embed.weight", "[53, 255]");
}

TEST(EngramTableTest, RowCountNotMatchingConfigIsDataLoss) {
  ExpectDataLoss(MakeCheckpoint(formats::RowFormat::kFp8,
                                [](std::vector<TensorDecl>& d) {
                                  d[1].shape = {kRows14 + 1, 256};
                                }),
                 "layers.14.engram.embed.weight", "[54, 256]");
}

TEST(EngramTableTest, WrongRankIsDataLoss) {
  ExpectDataLoss(MakeCheckpoint(formats::RowFormat::kFp8,
                                [](std::vector<TensorDecl>& d) {
                                  d[2].shape = {kRows14 * 8};
                                }),
                 "layers.14.engram.embed.scale", "[424]");
}

TEST(EngramTableTest, MissingTensorIsNotFound) {
  const std::string dir =
      MakeCheckpoint(formats::RowFormat::kFp8,
                     [](std::vector<TensorDecl>& d) { d.pop_back(); });
  std::unique_ptr<ShardedCheckpoint> checkpoint = Open(dir);
  ASSERT_NE(checkpoint, nullptr);
  absl::StatusOr<EngramTableLocation> table =
      LocateEngramTable(*checkpoint, MakeConfig(formats::RowFormat::kFp8), 14);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(table.status().message(),
              HasSubstr("layers.14.engram.embed.scale"));
}

TEST(EngramTableTest, BadArguments) {
  const std::string dir = MakeCheckpoint(formats::RowFormat::kNvfp4);
  std::unique_ptr<ShardedCheckpoint> checkpoint = Open(dir);
  ASSERT_NE(checkpoint, nullptr);
  absl::StatusOr<EngramTableLocation> table =
      LocateEngramTable(*checkpoint, MakeConfig(formats::RowFormat::kNvfp4), 2);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(table.status().message(), HasSubstr("layer 2"));

  EngramConfig no_scale = MakeConfig(formats::RowFormat::kNvfp4);
  no_scale.global_scales.erase(14);
  table = LocateEngramTable(*checkpoint, no_scale, 14);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(table.status().message(), HasSubstr("layer 14"));

  EngramConfig unspecified = MakeConfig(formats::RowFormat::kUnspecified);
  table = LocateEngramTable(*checkpoint, unspecified, 1);
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngramTableTest, WeightAndScaleMayLiveInDifferentShards) {
  const std::string dir = MakeTempDir();
  std::vector<TensorDecl> decls =
      TableDecls(1, kRows1, formats::RowFormat::kFp8);
  WritePatternFile(dir + "/" + kShard1, {decls[0], decls[1]}, 0);
  WritePatternFile(dir + "/" + kShard2, {decls[2]}, 0);
  CheckpointIndex index;
  index.weight_map = {{decls[0].name, kShard1},
                      {decls[1].name, kShard1},
                      {decls[2].name, kShard2}};
  ASSERT_TRUE(
      WriteCheckpointIndex(dir + "/model.safetensors.index.json", index).ok());
  std::unique_ptr<ShardedCheckpoint> checkpoint = Open(dir);
  ASSERT_NE(checkpoint, nullptr);
  EngramConfig config = MakeConfig(formats::RowFormat::kFp8);
  config.layer_ids = {1};
  config.num_embeddings = {kRows1};
  absl::StatusOr<EngramTableLocation> table =
      LocateEngramTable(*checkpoint, config, 1);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->shard_path, dir + "/" + kShard1);
  EXPECT_EQ(table->scale_shard_path, dir + "/" + kShard2);
}

TEST(EngramTableTest, TensorNames) {
  EXPECT_EQ(EngramWeightTensorName(14), "layers.14.engram.embed.weight");
  EXPECT_EQ(EngramScaleTensorName(1), "layers.1.engram.embed.scale");
}

}  // namespace
}  // namespace mneme::checkpoint
