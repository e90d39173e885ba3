#include "checkpoint/safetensors_reader.h"

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::PatternBytes;
using ::mneme::checkpoint::testing::SafetensorsBytes;
using ::mneme::checkpoint::testing::WriteFileOrFail;
using ::mneme::checkpoint::testing::WritePatternFile;
using ::testing::HasSubstr;

TEST(SafetensorsReaderTest, MissingFileIsNotFound) {
  const std::string path = MakeTempDir() + "/absent.safetensors";
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr(path));
}

TEST(SafetensorsReaderTest, DirectoryIsInvalidArgument) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(dir);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reader.status().message(), HasSubstr(dir));
}

TEST(SafetensorsReaderTest, TruncatedFilesAreDataLoss) {
  const std::string dir = MakeTempDir();
  const std::string header =
      R"({"layers.1.engram.embed.weight":{"dtype":"F8_E4M3","shape":[4,2],)"
      R"("data_offsets":[0,8]}})";
  const std::string full = SafetensorsBytes(header, std::string(8, 'x'));
  // Cut inside the length, inside the header, and inside the data.
  for (size_t size : {size_t{0}, size_t{5}, size_t{20}, full.size() - 1}) {
    const std::string path = dir + "/cut" + std::to_string(size);
    WriteFileOrFail(path, full.substr(0, size));
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
        SafetensorsReader::Create(path);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << size;
    EXPECT_THAT(reader.status().message(), HasSubstr(path));
    if (size == full.size() - 1) {
      EXPECT_THAT(reader.status().message(),
                  HasSubstr("layers.1.engram.embed.weight"));
    }
  }
}

TEST(SafetensorsReaderTest, ReadsTensorsRangesAndRawOffsets) {
  const std::string path = MakeTempDir() + "/t.safetensors";
  WritePatternFile(path, {{"a", DType::kF32, {3, 5}}, {"b", DType::kU8, {100}}},
                   /*seed=*/7);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->path(), path);
  EXPECT_GE((*reader)->fd(), 0);

  absl::StatusOr<std::vector<uint8_t>> a = (*reader)->ReadTensor("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, PatternBytes(60, 7));
  const std::vector<uint8_t> b_want = PatternBytes(100, 8);

  std::vector<uint8_t> range(10);
  ASSERT_TRUE((*reader)->ReadTensorRange("b", 90, absl::MakeSpan(range)).ok());
  EXPECT_EQ(range, std::vector<uint8_t>(b_want.begin() + 90, b_want.end()));

  absl::StatusOr<const TensorInfo*> b = (*reader)->Find("b");
  ASSERT_TRUE(b.ok());
  std::vector<uint8_t> raw(4);
  ASSERT_TRUE((*reader)->ReadAt((*b)->offset + 3, absl::MakeSpan(raw)).ok());
  EXPECT_EQ(raw, std::vector<uint8_t>(b_want.begin() + 3, b_want.begin() + 7));

  // The absolute offset works with a plain pread as well.
  std::vector<uint8_t> direct(100);
  ASSERT_EQ(pread((*reader)->fd(), direct.data(), direct.size(),
                  static_cast<off_t>((*b)->offset)),
            100);
  EXPECT_EQ(direct, b_want);
}

TEST(SafetensorsReaderTest, BadReadArguments) {
  const std::string path = MakeTempDir() + "/t.safetensors";
  WritePatternFile(path, {{"layers.3.x", DType::kU8, {16}}}, 1);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();

  absl::StatusOr<std::vector<uint8_t>> missing =
      (*reader)->ReadTensor("layers.3.y");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("layers.3.y"));
  EXPECT_THAT(missing.status().message(), HasSubstr(path));

  std::vector<uint8_t> out(8);
  absl::Status status =
      (*reader)->ReadTensorRange("layers.3.x", 9, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("layers.3.x"));
  EXPECT_THAT(status.message(), HasSubstr(path));
  status = (*reader)->ReadTensorRange("layers.3.x", ~uint64_t{0},
                                      absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      (*reader)->ReadTensorRange("layers.3.x", 8, absl::MakeSpan(out)).ok());

  status = (*reader)->ReadAt((*reader)->file_size() - 4, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path));
  status = (*reader)->ReadAt(~uint64_t{0} - 2, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsReaderTest, FileShrunkAfterOpenIsDataLoss) {
  const std::string path = MakeTempDir() + "/t.safetensors";
  WritePatternFile(path, {{"w", DType::kU8, {4096}}}, 1);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  absl::StatusOr<std::vector<uint8_t>> w = (*reader)->ReadTensor("w");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(w.status().message(), HasSubstr(path));
}

TEST(SafetensorsReaderTest, RejectsCorruptHeaderNamingFileAndTensor) {
  const std::string path = MakeTempDir() + "/bad.safetensors";
  WriteFileOrFail(path, SafetensorsBytes(R"({"layers.14.engram.embed.scale":)"
                                         R"({"dtype":"F8_E8M0","shape":[2,8],)"
                                         R"("data_offsets":[0,15]}})",
                                         std::string(16, '\0')));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(reader.status().message(), HasSubstr(path));
  EXPECT_THAT(reader.status().message(),
              HasSubstr("layers.14.engram.embed.scale"));
}

}  // namespace
}  // namespace mneme::checkpoint
