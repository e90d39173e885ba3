#include "tools/quant/shard_file_writer.h"

#include <filesystem>

#include "checkpoint/safetensors_reader.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace mneme::quant {
namespace {

using checkpoint::DType;

std::vector<checkpoint::TensorDecl> Decls() {
  return {{"a", DType::kU8, {4, 3}},
          {"b", DType::kF32, {}},
          {"c", DType::kF8E4M3, {2, 8}}};
}

TEST(ShardFileWriterTest, WritesAReadableFileInAnyOrder) {
  const std::string path =
      mneme::testing::MakeTempDir("sfw") + "/x.safetensors";
  auto w = ShardFileWriter::Create(path, Decls(), {{"format", "pt"}},
                                   ShardOpenMode::kCreate);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->data_bytes(), 12u + 4u + 16u);
  EXPECT_EQ((*w)->file_size(), std::filesystem::file_size(path));
  std::vector<uint8_t> c(16);
  for (int i = 0; i < 16; ++i) c[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE((*w)->Write("c", 8, absl::MakeConstSpan(c).subspan(8)).ok());
  ASSERT_TRUE((*w)->Write("c", 0, absl::MakeConstSpan(c).first(8)).ok());
  ASSERT_TRUE((*w)->Write("a", 0, std::vector<uint8_t>(12, 7)).ok());
  const float one = 1.0f;
  ASSERT_TRUE((*w)->Write("b", 0,
                          absl::MakeConstSpan(
                              reinterpret_cast<const uint8_t*>(&one), 4))
                  .ok());
  EXPECT_EQ((*w)->Write("a", 10, std::vector<uint8_t>(3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Write("zz", 0, std::vector<uint8_t>(1)).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ((*w)->Close().code(), absl::StatusCode::kFailedPrecondition);

  auto r = checkpoint::SafetensorsReader::Create(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->metadata().at("format"), "pt");
  EXPECT_EQ(*(*r)->ReadTensor("c"), c);
  EXPECT_EQ(*(*r)->ReadTensor("a"), std::vector<uint8_t>(12, 7));
  EXPECT_TRUE((*r)->FindOrNull("b")->shape.empty());

  // Copying a tensor from a reader.
  const std::string copy = path + ".copy";
  auto w2 = ShardFileWriter::Create(copy, {{"c2", DType::kU8, {16}}}, {},
                                    ShardOpenMode::kCreate);
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->CopyTensor(**r, "c", "c2").ok());
  EXPECT_EQ((*w2)->CopyTensor(**r, "a", "c2").code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*w2)->Close().ok());
  EXPECT_EQ(*(*checkpoint::SafetensorsReader::Create(copy))->ReadTensor("c2"),
            c);
}

TEST(ShardFileWriterTest, ReopensOnlyAMatchingFile) {
  const std::string path = mneme::testing::MakeTempDir("sfw2") + "/x";
  auto w = ShardFileWriter::Create(path, Decls(), {}, ShardOpenMode::kCreate);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write("a", 0, std::vector<uint8_t>(12, 9)).ok());
  ASSERT_TRUE((*w)->Close().ok());
  // Same declarations: the bytes written before are still there.
  auto again =
      ShardFileWriter::Create(path, Decls(), {}, ShardOpenMode::kReopen);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Write("c", 0, std::vector<uint8_t>(16, 1)).ok());
  ASSERT_TRUE((*again)->Close().ok());
  EXPECT_EQ(*(*checkpoint::SafetensorsReader::Create(path))->ReadTensor("a"),
            std::vector<uint8_t>(12, 9));
  // Other declarations or metadata: DataLoss.
  std::vector<checkpoint::TensorDecl> other = Decls();
  other[0].shape = {3, 4};
  EXPECT_EQ(ShardFileWriter::Create(path, other, {}, ShardOpenMode::kReopen)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ShardFileWriter::Create(path, Decls(), {{"k", "v"}},
                                    ShardOpenMode::kReopen)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ShardFileWriter::Create(path + "-missing", Decls(), {},
                                    ShardOpenMode::kReopen)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(ShardFileWriterTest, RejectsBadDeclarations) {
  const std::string path = mneme::testing::MakeTempDir("sfw3") + "/x";
  EXPECT_EQ(ShardFileWriter::Create(
                path, {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}}, {},
                ShardOpenMode::kCreate)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardFileWriter::Create(path, {{"a", DType::kU8, {-1}}}, {},
                                    ShardOpenMode::kCreate)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardFileWriter::Create(path, {{"", DType::kU8, {1}}}, {},
                                    ShardOpenMode::kCreate)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::quant
