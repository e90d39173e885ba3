#include "engram_store/cache/source_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

std::string TempFile(const std::string& name, const std::string& content) {
  std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path, std::ios::trunc) << content;
  return path;
}

void SetMtime(const std::string& path, time_t seconds) {
  struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST(SourceFingerprintTest, ChangesWithSizeAndMtime) {
  const std::string a = TempFile("a.safetensors", "0123456789");
  const std::string b = TempFile("b.safetensors", "abc");
  SetMtime(a, 1000);
  SetMtime(b, 2000);
  const std::vector<std::string> paths = {a, b};
  absl::StatusOr<std::string> first = SourceFingerprint(paths);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*SourceFingerprint(paths), *first);  // stable
  EXPECT_NE(first->find(a + ":10:1000000000000"), std::string::npos) << *first;

  SetMtime(b, 2001);
  absl::StatusOr<std::string> touched = SourceFingerprint(paths);
  ASSERT_TRUE(touched.ok());
  EXPECT_NE(*touched, *first);

  TempFile("a.safetensors", "0123456789X");
  SetMtime(a, 1000);
  SetMtime(b, 2000);
  absl::StatusOr<std::string> resized = SourceFingerprint(paths);
  ASSERT_TRUE(resized.ok());
  EXPECT_NE(*resized, *first);
}

TEST(SourceFingerprintTest, Errors) {
  EXPECT_EQ(SourceFingerprint({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> missing = {
      std::string(std::getenv("TEST_TMPDIR")) + "/no_such_file"};
  EXPECT_EQ(SourceFingerprint(missing).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mneme::engram
