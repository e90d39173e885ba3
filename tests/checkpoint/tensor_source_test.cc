// Conformance suite of checkpoint::TensorSource: the same cases over every
// implementation, each reading real safetensors files written to a temp dir.

#include "checkpoint/tensor_source.h"

#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/sharded_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::PatternBytes;
using ::mneme::checkpoint::testing::WritePatternFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An opened source and, per tensor, the file that holds its bytes.
struct OpenedSource {
  std::unique_ptr<TensorSource> source;
  std::map<std::string, std::string> file_of;
};

// Writes `tensors` (tensor i filled with PatternBytes(bytes, seed + i)) in
// some on-disk layout under `dir` and opens them.
using SourceFactory = std::function<OpenedSource(
    const std::string& dir, const std::vector<TensorDecl>& tensors,
    uint32_t seed)>;

struct FactoryCase {
  std::string name;
  SourceFactory make;
};

OpenedSource MakeSafetensorsReader(const std::string& dir,
                                   const std::vector<TensorDecl>& tensors,
                                   uint32_t seed) {
  const std::string path = dir + "/tensors.safetensors";
  WritePatternFile(path, tensors, seed);
  OpenedSource opened;
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (reader.ok()) opened.source = *std::move(reader);
  for (const TensorDecl& decl : tensors) opened.file_of[decl.name] = path;
  return opened;
}

OpenedSource OpenCheckpoint(const std::string& dir, OpenedSource opened) {
  absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> checkpoint =
      ShardedCheckpoint::Create(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (checkpoint.ok()) opened.source = *std::move(checkpoint);
  return opened;
}

OpenedSource MakeSingleFileCheckpoint(const std::string& dir,
                                      const std::vector<TensorDecl>& tensors,
                                      uint32_t seed) {
  const std::string path = dir + "/" + std::string(kSingleShardFileName);
  WritePatternFile(path, tensors, seed);
  OpenedSource opened;
  for (const TensorDecl& decl : tensors) opened.file_of[decl.name] = path;
  return OpenCheckpoint(dir, std::move(opened));
}

// Two shards, tensors alternating between them, and an index.
OpenedSource MakeIndexedCheckpoint(const std::string& dir,
                                   const std::vector<TensorDecl>& tensors,
                                   uint32_t seed) {
  const std::string shard_names[2] = {"model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors"};
  std::vector<TensorDecl> shard_tensors[2];
  CheckpointIndex index;
  uint64_t total_size = 0;
  OpenedSource opened;
  for (size_t i = 0; i < tensors.size(); ++i) {
    shard_tensors[i % 2].push_back(tensors[i]);
    index.weight_map[tensors[i].name] = shard_names[i % 2];
    opened.file_of[tensors[i].name] = dir + "/" + shard_names[i % 2];
  }
  // Tensor i must still be filled with PatternBytes(bytes, seed + i): write
  // each shard tensor by tensor through its own seed.
  for (int shard = 0; shard < 2; ++shard) {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
        SafetensorsWriter::Create(dir + "/" + shard_names[shard],
                                  shard_tensors[shard]);
    EXPECT_TRUE(writer.ok()) << writer.status();
    if (!writer.ok()) return opened;
    for (size_t i = shard; i < tensors.size(); i += 2) {
      const TensorInfo& info = (*writer)->layout()[i / 2];
      total_size += info.byte_length;
      EXPECT_TRUE(
          (*writer)
              ->Append(info.name, PatternBytes(info.byte_length,
                                               seed + static_cast<uint32_t>(i)))
              .ok());
    }
    EXPECT_TRUE((*writer)->Finish().ok());
  }
  index.total_size = total_size;
  EXPECT_TRUE(
      WriteCheckpointIndex(dir + "/" + std::string(kIndexFileName), index)
          .ok());
  return OpenCheckpoint(dir, std::move(opened));
}

constexpr uint32_t kSeed = 40;

// Declaration order differs from name order on purpose.
std::vector<TensorDecl> Tensors() {
  return {
      {"layers.1.w", DType::kBf16, {3, 5}},  // 30 bytes
      {"embed", DType::kF8E4M3, {7, 4}},     // 28 bytes
      {"layers.0.scale", DType::kF32, {}},   // scalar: 4 bytes
      {"empty", DType::kI64, {0, 3}},        // 0 bytes
      {"layers.0.w", DType::kI32, {2, 2}},   // 16 bytes
  };
}

// PatternBytes of tensor `name` as written by every factory.
std::vector<uint8_t> ExpectedBytes(const std::string& name) {
  const std::vector<TensorDecl> tensors = Tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name != name) continue;
    uint64_t bytes = DTypeSize(tensors[i].dtype);
    for (int64_t d : tensors[i].shape) bytes *= static_cast<uint64_t>(d);
    return PatternBytes(bytes, kSeed + static_cast<uint32_t>(i));
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

class TensorSourceTest : public ::testing::TestWithParam<FactoryCase> {
 protected:
  void SetUp() override {
    opened_ = GetParam().make(MakeTempDir(), Tensors(), kSeed);
    ASSERT_NE(opened_.source, nullptr);
  }
  const TensorSource& source() const { return *opened_.source; }

  OpenedSource opened_;
};

TEST_P(TensorSourceTest, NamesAreSortedAndComplete) {
  EXPECT_THAT(source().TensorNames(),
              ElementsAre("embed", "empty", "layers.0.scale", "layers.0.w",
                          "layers.1.w"));
}

TEST_P(TensorSourceTest, SpecsMatchTheDeclarations) {
  for (const TensorDecl& decl : Tensors()) {
    absl::StatusOr<TensorSpec> spec = source().GetTensorSpec(decl.name);
    ASSERT_TRUE(spec.ok()) << decl.name << ": " << spec.status();
    EXPECT_EQ(spec->dtype, decl.dtype) << decl.name;
    EXPECT_EQ(spec->shape, decl.shape) << decl.name;
    EXPECT_EQ(spec->byte_length, ExpectedBytes(decl.name).size()) << decl.name;
  }
}

TEST_P(TensorSourceTest, UnknownNameIsNotFound) {
  absl::StatusOr<TensorSpec> spec = source().GetTensorSpec("missing.weight");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("missing.weight"));

  absl::StatusOr<std::vector<uint8_t>> bytes =
      source().ReadTensorBytes("missing.weight");
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bytes.status().message(), HasSubstr("missing.weight"));

  std::vector<uint8_t> out(1);
  absl::Status status =
      source().ReadTensorByteRange("missing.weight", 0, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("missing.weight"));
}

TEST_P(TensorSourceTest, ReadsWholeTensors) {
  for (const TensorDecl& decl : Tensors()) {
    absl::StatusOr<std::vector<uint8_t>> bytes =
        source().ReadTensorBytes(decl.name);
    ASSERT_TRUE(bytes.ok()) << decl.name << ": " << bytes.status();
    EXPECT_EQ(*bytes, ExpectedBytes(decl.name)) << decl.name;
  }
}

TEST_P(TensorSourceTest, ReadsByteRanges) {
  const std::vector<uint8_t> expected = ExpectedBytes("layers.1.w");
  std::vector<uint8_t> out(11);
  ASSERT_TRUE(
      source().ReadTensorByteRange("layers.1.w", 7, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out,
            std::vector<uint8_t>(expected.begin() + 7, expected.begin() + 18));

  // The whole tensor, and empty ranges at either end, are inside it.
  std::vector<uint8_t> whole(expected.size());
  ASSERT_TRUE(source()
                  .ReadTensorByteRange("layers.1.w", 0, absl::MakeSpan(whole))
                  .ok());
  EXPECT_EQ(whole, expected);
  EXPECT_TRUE(source().ReadTensorByteRange("layers.1.w", 0, {}).ok());
  EXPECT_TRUE(
      source().ReadTensorByteRange("layers.1.w", expected.size(), {}).ok());
  EXPECT_TRUE(source().ReadTensorByteRange("empty", 0, {}).ok());
}

TEST_P(TensorSourceTest, RangePastTheTensorIsOutOfRange) {
  const uint64_t length = ExpectedBytes("layers.0.w").size();  // 16
  std::vector<uint8_t> out(4, 0xAB);
  // Ends one byte past the tensor.
  absl::Status status = source().ReadTensorByteRange("layers.0.w", length - 3,
                                                     absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_THAT(status.message(), HasSubstr("layers.0.w"));
  // Starts past the tensor.
  status = source().ReadTensorByteRange("layers.0.w", length + 1, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  // An offset that would overflow offset + size.
  status = source().ReadTensorByteRange("layers.0.w", ~uint64_t{0},
                                        absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  // Any byte of a zero-length tensor.
  status = source().ReadTensorByteRange("empty", 0, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  // Nothing was written into `out`.
  EXPECT_EQ(out, std::vector<uint8_t>(4, 0xAB));
}

TEST_P(TensorSourceTest, ShortReadIsDataLoss) {
  // Cut the file holding "layers.1.w" in front of that tensor's last byte,
  // after the source was opened.
  const std::string& path = opened_.file_of.at("layers.1.w");
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const TensorInfo* info = (*reader)->FindOrNull("layers.1.w");
  ASSERT_NE(info, nullptr);
  const uint64_t cut = info->offset + info->byte_length - 1;
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(cut)), 0);

  absl::StatusOr<std::vector<uint8_t>> bytes =
      source().ReadTensorBytes("layers.1.w");
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kDataLoss)
      << bytes.status();
  std::vector<uint8_t> out(2);
  absl::Status status = source().ReadTensorByteRange(
      "layers.1.w", info->byte_length - 2, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  // A range that ends before the cut still reads.
  EXPECT_TRUE(
      source().ReadTensorByteRange("layers.1.w", 0, absl::MakeSpan(out)).ok());
}

INSTANTIATE_TEST_SUITE_P(
    AllSources, TensorSourceTest,
    ::testing::Values(
        FactoryCase{"SafetensorsReader", MakeSafetensorsReader},
        FactoryCase{"ShardedCheckpointSingleFile", MakeSingleFileCheckpoint},
        FactoryCase{"ShardedCheckpointIndexed", MakeIndexedCheckpoint}),
    [](const ::testing::TestParamInfo<FactoryCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme::checkpoint
