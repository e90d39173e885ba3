#include "engram_store/io/row_file.h"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/io_test_util.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WriteRandomFile;
using ::testing::HasSubstr;

TEST(RowFileTest, OpensInEveryMode) {
  const std::string path = TempPath("row_file.bin");
  ASSERT_TRUE(WriteRandomFile(path, 12345, 1).ok());
  for (OpenMode mode :
       {OpenMode::kBuffered, OpenMode::kDirect, OpenMode::kNfs}) {
    absl::StatusOr<std::unique_ptr<RowFile>> file = RowFile::Open(path, mode);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->path(), path);
    EXPECT_EQ((*file)->mode(), mode);
    EXPECT_EQ((*file)->size(), 12345u);
    EXPECT_GE((*file)->fd(), 0);
    EXPECT_EQ((*file)->alignment(),
              mode == OpenMode::kDirect ? RowFile::kDirectAlignment : 1u);
  }
  EXPECT_EQ(OpenModeName(OpenMode::kDirect), "direct");
}

TEST(RowFileTest, MissingFileIsNotFound) {
  const std::string path = TempPath("does_not_exist.bin");
  absl::StatusOr<std::unique_ptr<RowFile>> file =
      RowFile::Open(path, OpenMode::kBuffered);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
}

TEST(RowFileTest, DirectoryAndEmptyPathAreInvalid) {
  const std::string dir = TempPath("a_directory");
  ::mkdir(dir.c_str(), 0755);
  EXPECT_EQ(RowFile::Open(dir, OpenMode::kBuffered).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowFile::Open("", OpenMode::kBuffered).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RowFileTest, DirectOnTmpfsIsFailedPrecondition) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994 /*TMPFS*/) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  const std::string path = "/dev/shm/mneme_row_file_test.bin";
  ASSERT_TRUE(WriteRandomFile(path, 8192, 1).ok());
  absl::StatusOr<std::unique_ptr<RowFile>> file =
      RowFile::Open(path, OpenMode::kDirect);
  ::unlink(path.c_str());
  if (file.ok()) GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mneme::engram
