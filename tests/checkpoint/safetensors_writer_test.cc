#include "checkpoint/safetensors_writer.h"

#include <dirent.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "checkpoint/safetensors_reader.h"
#include "common/file_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::FileExists;
using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::PatternBytes;
using ::mneme::checkpoint::testing::WritePatternFile;
using ::testing::HasSubstr;

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* entry = readdir(d)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

class RoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTripTest, WriterOutputReadsBackExactly) {
  const DType dtype = GetParam();
  const std::string path = MakeTempDir() + "/rt.safetensors";
  const std::vector<TensorDecl> decls = {
      {"matrix", dtype, {7, 9}},
      {"vector", dtype, {13}},
      {"scalar", dtype, {}},
      {"empty", dtype, {0, 4}},
  };
  SafetensorsWriterOptions options;
  options.metadata = {{"format", "pt"}, {"origin", "round-trip"}};
  WritePatternFile(path, decls, /*seed=*/11, options);

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata(), options.metadata);
  ASSERT_EQ((*reader)->tensors().size(), decls.size());
  EXPECT_EQ((*reader)->header().data_offset % 8, 0u);
  for (size_t i = 0; i < decls.size(); ++i) {
    absl::StatusOr<const TensorInfo*> info = (*reader)->Find(decls[i].name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ((*info)->dtype, dtype);
    EXPECT_EQ((*info)->shape, decls[i].shape);
    int64_t elements = 1;
    for (int64_t d : decls[i].shape) elements *= d;
    EXPECT_EQ((*info)->byte_length,
              static_cast<uint64_t>(elements) * DTypeSize(dtype));
    absl::StatusOr<std::vector<uint8_t>> bytes =
        (*reader)->ReadTensor(decls[i].name);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, PatternBytes((*info)->byte_length,
                                   11 + static_cast<uint32_t>(i)));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RoundTripTest,
                         ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(SafetensorsWriterTest, HeaderIsSpacePaddedToEightBytes) {
  const std::string dir = MakeTempDir();
  // Names of varying length exercise every padding amount.
  for (int n = 1; n <= 8; ++n) {
    const std::string path = dir + "/p" + std::to_string(n);
    WritePatternFile(path, {{std::string(n, 'w'), DType::kU8, {3}}}, 0);
    absl::StatusOr<std::string> bytes = ReadSmallFile(path, 1 << 20);
    ASSERT_TRUE(bytes.ok());
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) {
      length |= uint64_t{static_cast<uint8_t>((*bytes)[i])} << (8 * i);
    }
    EXPECT_EQ(length % 8, 0u);
    const std::string header = bytes->substr(8, length);
    EXPECT_EQ(header.front(), '{');
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    EXPECT_LT(header.size() - close - 1, 8u);
  }
}

TEST(SafetensorsWriterTest, InterleavedSmallChunksLandInPlace) {
  const std::string path = MakeTempDir() + "/rows.safetensors";
  constexpr int kRows = 1000;
  SafetensorsWriterOptions options;
  options.buffer_bytes = 4096;  // Forces many flushes.
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(path,
                                {{"w", DType::kF8E4M3, {kRows, 256}},
                                 {"s", DType::kF8E8M0, {kRows, 8}}},
                                options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::vector<uint8_t> w = PatternBytes(size_t{kRows} * 256, 1);
  const std::vector<uint8_t> s = PatternBytes(size_t{kRows} * 8, 2);
  for (int r = 0; r < kRows; ++r) {
    ASSERT_TRUE((*writer)
                    ->Append("w", absl::MakeConstSpan(w).subspan(
                                      static_cast<size_t>(r) * 256, 256))
                    .ok());
    ASSERT_TRUE((*writer)
                    ->Append("s", absl::MakeConstSpan(s).subspan(
                                      static_cast<size_t>(r) * 8, 8))
                    .ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->ReadTensor("w"), w);
  EXPECT_EQ(*(*reader)->ReadTensor("s"), s);
}

TEST(SafetensorsWriterTest, ChunksLargerThanTheBufferAndUnbuffered) {
  for (size_t buffer : {size_t{0}, size_t{7}, size_t{1} << 20}) {
    const std::string path = MakeTempDir() + "/big.safetensors";
    SafetensorsWriterOptions options;
    options.buffer_bytes = buffer;
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
        SafetensorsWriter::Create(path, {{"t", DType::kI32, {1000}}}, options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const std::vector<uint8_t> bytes = PatternBytes(4000, 3);
    auto span = absl::MakeConstSpan(bytes);
    ASSERT_TRUE((*writer)->Append("t", span.subspan(0, 5)).ok());
    ASSERT_TRUE((*writer)->Append("t", span.subspan(5, 3000)).ok());
    ASSERT_TRUE((*writer)->Append("t", span.subspan(3005, 0)).ok());
    ASSERT_TRUE((*writer)->Append("t", span.subspan(3005)).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
        SafetensorsReader::Create(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(*(*reader)->ReadTensor("t"), bytes) << buffer;
  }
}

TEST(SafetensorsWriterTest, PartialFileNeverAppearsUnderFinalName) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/model.safetensors";
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
        SafetensorsWriter::Create(path, {{"t", DType::kU8, {10}}});
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append("t", PatternBytes(10, 0)).ok());
    EXPECT_FALSE(FileExists(path));
    EXPECT_EQ(ListDir(dir).size(), 1u);  // The temporary file.
    // Destroyed without Finish().
  }
  EXPECT_FALSE(FileExists(path));
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(SafetensorsWriterTest, FinishReplacesAnExistingFile) {
  const std::string path = MakeTempDir() + "/m.safetensors";
  WritePatternFile(path, {{"old", DType::kU8, {1}}}, 0);
  WritePatternFile(path, {{"new", DType::kU8, {2}}}, 0);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->FindOrNull("old"), nullptr);
  EXPECT_NE((*reader)->FindOrNull("new"), nullptr);
}

TEST(SafetensorsWriterTest, ByteCountsAreVerified) {
  const std::string path = MakeTempDir() + "/m.safetensors";
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(path, {{"layers.1.a", DType::kBf16, {4}},
                                       {"layers.1.b", DType::kU8, {2}}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  SafetensorsWriter& w = **writer;

  absl::Status status = w.Append("layers.1.a", PatternBytes(9, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("layers.1.a"));
  EXPECT_THAT(status.message(), HasSubstr(path));

  status = w.Append("layers.1.c", PatternBytes(1, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("layers.1.c"));

  ASSERT_TRUE(w.Append("layers.1.a", PatternBytes(8, 0)).ok());
  status = w.Append("layers.1.a", PatternBytes(1, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(w.Append("layers.1.b", PatternBytes(1, 0)).ok());
  status = w.Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("layers.1.b"));
  EXPECT_THAT(status.message(), HasSubstr("only 1 of 2"));
  EXPECT_FALSE(FileExists(path));

  // Still usable: complete the tensor and finish.
  ASSERT_TRUE(w.Append("layers.1.b", PatternBytes(1, 0)).ok());
  ASSERT_TRUE(w.Finish().ok());
  EXPECT_TRUE(FileExists(path));
  EXPECT_EQ(w.Finish().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.Append("layers.1.b", {}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SafetensorsWriterTest, RejectsBadDeclarations) {
  const std::string path = MakeTempDir() + "/m.safetensors";
  struct Case {
    std::vector<TensorDecl> decls;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{{"", DType::kU8, {1}}}, "empty name"},
      {{{"__metadata__", DType::kU8, {1}}}, "__metadata__"},
      {{{"t.dup", DType::kU8, {1}}, {"t.dup", DType::kU8, {1}}}, "t.dup"},
      {{{"t.neg", DType::kU8, {2, -1}}}, "t.neg"},
      {{{"t.overflow", DType::kI64, {int64_t{1} << 62}}}, "t.overflow"},
      {{{"t.total1", DType::kU8, {int64_t{1} << 62, 3}},
        {"t.total2", DType::kU8, {int64_t{1} << 62, 2}}},
       "t.total2"},
      {{{"bad\xff", DType::kU8, {1}}}, "UTF-8"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
        SafetensorsWriter::Create(path, c.decls);
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument)
        << c.want;
    EXPECT_THAT(writer.status().message(), HasSubstr(c.want));
    EXPECT_THAT(writer.status().message(), HasSubstr(path));
  }
  SafetensorsWriterOptions options;
  options.metadata = {{"k", "bad\xc0\x80"}};
  EXPECT_EQ(SafetensorsWriter::Create(path, {}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(FileExists(path));
}

TEST(EncodeSafetensorsHeaderTest, EncodesExactBytesAndLayout) {
  absl::StatusOr<EncodedSafetensorsHeader> encoded = EncodeSafetensorsHeader(
      {{"b", DType::kU8, {3}}, {"a", DType::kBf16, {2, 2}}}, {{"format", "pt"}},
      "test");
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::string json =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
      R"("a":{"dtype":"BF16","shape":[2,2],"data_offsets":[3,11]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  ASSERT_EQ(encoded->prefix.size(), kSafetensorsLengthBytes + padded.size());
  EXPECT_EQ(encoded->prefix.substr(kSafetensorsLengthBytes), padded);
  EXPECT_EQ(static_cast<uint8_t>(encoded->prefix[0]), padded.size());
  EXPECT_EQ(encoded->prefix.substr(1, kSafetensorsLengthBytes - 1),
            std::string(kSafetensorsLengthBytes - 1, '\0'));
  EXPECT_EQ(encoded->data_bytes, 11u);
  ASSERT_EQ(encoded->layout.size(), 2u);
  EXPECT_EQ(encoded->layout[0].name, "b");
  EXPECT_EQ(encoded->layout[0].offset, encoded->prefix.size());
  EXPECT_EQ(encoded->layout[1].name, "a");
  EXPECT_EQ(encoded->layout[1].offset, encoded->prefix.size() + 3);
  EXPECT_EQ(encoded->layout[1].byte_length, 8u);

  absl::StatusOr<EncodedSafetensorsHeader> bad = EncodeSafetensorsHeader(
      {{"x", DType::kU8, {-1}}}, {}, "shard 'out/x.safetensors'");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("shard 'out/x.safetensors', tensor 'x'"));
}

TEST(SafetensorsWriterTest, MissingDirectoryIsNotFound) {
  const std::string path = MakeTempDir() + "/no/such/dir/m.safetensors";
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(path, {{"t", DType::kU8, {1}}});
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(writer.status().message(), HasSubstr(path));
}

TEST(SafetensorsWriterTest, LayoutIsContiguousInDeclarationOrder) {
  const std::string path = MakeTempDir() + "/m.safetensors";
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(
          path, {{"z", DType::kF32, {3}}, {"a", DType::kI8, {5}}});
  ASSERT_TRUE(writer.ok());
  const std::vector<TensorInfo>& layout = (*writer)->layout();
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_EQ(layout[0].name, "z");
  EXPECT_EQ(layout[1].offset, layout[0].offset + 12);
  EXPECT_EQ(layout[0].offset % 8, 0u);
  EXPECT_EQ((*writer)->data_bytes(), 17u);
  ASSERT_TRUE((*writer)->Append("z", PatternBytes(12, 0)).ok());
  ASSERT_TRUE((*writer)->Append("a", PatternBytes(5, 1)).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->FindOrNull("a")->offset, layout[1].offset);
  EXPECT_EQ((*reader)->file_size(), layout[1].offset + 5);
}

}  // namespace
}  // namespace mneme::checkpoint
