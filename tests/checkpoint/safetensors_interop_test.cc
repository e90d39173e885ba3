// Cross-checks the reader and the writer against an independent Python
// implementation of the format (safetensors_interop.py).

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "common/file_io.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::MakeTempDir;
using ::mneme::checkpoint::testing::WritePatternFile;

std::string ScriptPath() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "mneme",
                      "/tests/checkpoint/safetensors_interop.py");
}

int RunPython(const std::string& args, const std::string& log) {
  const std::string command = absl::StrCat("/usr/bin/python3 ", ScriptPath(),
                                           " ", args, " > ", log, " 2>&1");
  return system(command.c_str());
}

template <typename T>
std::vector<uint8_t> Bytes(std::initializer_list<T> values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

TEST(SafetensorsInteropTest, ReadsFileWrittenByPython) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/py.safetensors";
  ASSERT_EQ(RunPython("write " + path, dir + "/log"), 0);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
      SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata().at("format"), "pt");
  EXPECT_EQ((*reader)->tensors().size(), 10u);

  const TensorInfo* f32 = (*reader)->FindOrNull("f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->dtype, DType::kF32);
  EXPECT_EQ(f32->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*(*reader)->ReadTensor("f32"),
            Bytes<float>({1.5f, -2.0f, 0.0f, 3.25f, 1e-3f, -7.0f}));
  EXPECT_EQ(*(*reader)->ReadTensor("i64"),
            Bytes<int64_t>({-3, 0, int64_t{1} << 40}));
  EXPECT_EQ(*(*reader)->ReadTensor("i32"), Bytes<int32_t>({-1, 65536}));
  EXPECT_EQ(*(*reader)->ReadTensor("bf16"),
            Bytes<uint16_t>({0x3F80, 0xC000, 0, 0x7F80}));
  EXPECT_EQ(*(*reader)->ReadTensor("f16"), Bytes<uint16_t>({0x3C00}));
  EXPECT_EQ(*(*reader)->ReadTensor("e4m3"),
            (std::vector<uint8_t>{0x38, 0xB8, 0x7E, 0x00}));
  EXPECT_EQ((*reader)->FindOrNull("e4m3")->dtype, DType::kF8E4M3);
  EXPECT_EQ(*(*reader)->ReadTensor("e8m0"),
            (std::vector<uint8_t>{127, 128, 255}));
  EXPECT_EQ((*reader)->FindOrNull("e8m0")->dtype, DType::kF8E8M0);
  EXPECT_EQ(*(*reader)->ReadTensor("u8"),
            (std::vector<uint8_t>{0, 1, 2, 254, 255}));
  EXPECT_EQ(*(*reader)->ReadTensor("i8"), (std::vector<uint8_t>{0x80, 0x7F}));
  EXPECT_EQ((*reader)->FindOrNull("empty")->byte_length, 0u);
}

TEST(SafetensorsInteropTest, PythonAcceptsWriterOutput) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cc.safetensors";
  std::vector<TensorDecl> decls;
  int64_t columns = 1;
  for (DType dtype : kAllDTypes) {
    decls.push_back({absl::StrCat("t", columns, ".", DTypeName(dtype)),
                     dtype,
                     {3, columns}});
    ++columns;
  }
  decls.push_back({"scalar", DType::kF32, {}});
  decls.push_back({"empty", DType::kI64, {0}});
  SafetensorsWriterOptions options;
  options.metadata = {{"format", "pt"}};
  WritePatternFile(path, decls, /*seed=*/42, options);
  const std::string log = dir + "/log";
  const int rc = RunPython("check " + path + " 42", log);
  absl::StatusOr<std::string> output = ReadSmallFile(log, 1 << 20);
  EXPECT_EQ(rc, 0) << (output.ok() ? *output : "");
  ASSERT_TRUE(output.ok());
  EXPECT_NE(output->find("OK"), std::string::npos) << *output;
}

}  // namespace
}  // namespace mneme::checkpoint
