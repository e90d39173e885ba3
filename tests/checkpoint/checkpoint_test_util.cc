#include "tests/checkpoint/checkpoint_test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mneme::checkpoint::testing {

std::string MakeTempDir() {
  const char* root = getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(root != nullptr ? root : "/tmp", "/checkpoint_test.XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  const char* dir = mkdtemp(buffer.data());
  EXPECT_NE(dir, nullptr) << "mkdtemp " << pattern;
  return dir != nullptr ? std::string(dir) : std::string();
}

void WriteFileOrFail(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  EXPECT_TRUE(out.good()) << "writing " << path;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string SafetensorsBytes(absl::string_view header_json,
                             absl::string_view data) {
  std::string bytes(8, '\0');
  const uint64_t length = header_json.size();
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  }
  absl::StrAppend(&bytes, header_json, data);
  return bytes;
}

std::vector<uint8_t> PatternBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  uint64_t state = 0x9E3779B97F4A7C15ull ^ seed;
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    bytes[i] = static_cast<uint8_t>(state >> 56);
  }
  return bytes;
}

void WritePatternFile(const std::string& path,
                      const std::vector<TensorDecl>& tensors, uint32_t seed,
                      const SafetensorsWriterOptions& options) {
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer =
      SafetensorsWriter::Create(path, tensors, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& info = (*writer)->layout()[i];
    std::vector<uint8_t> bytes = PatternBytes(
        static_cast<size_t>(info.byte_length), seed + static_cast<uint32_t>(i));
    ASSERT_TRUE((*writer)->Append(info.name, bytes).ok());
  }
  absl::Status status = (*writer)->Finish();
  ASSERT_TRUE(status.ok()) << status;
}

}  // namespace mneme::checkpoint::testing
