#include "tools/quant/output_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/tools/quant/checkpoint_test_util.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;
using testing::ReadFile;

// A source directory with files, a subdirectory and a symbolic link.
std::string MakeTree() {
  std::string dir = mneme::testing::MakeTempDir("tree") + "/src";
  fs::create_directories(dir + "/sub");
  std::ofstream(dir + "/config.json") << "{}";
  std::ofstream(dir + "/keep.txt") << "keep";
  std::ofstream(dir + "/sub/nested.bin") << "nested";
  fs::create_symlink("keep.txt", dir + "/alias.txt");
  return dir;
}

ino_t Inode(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST(CheckOutputPathsTest, RefusesTheSourceItselfInsideItAndExisting) {
  const std::string src = MakeTree();
  EXPECT_EQ(CheckOutputPaths(src, src).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputPaths(src, src + "/").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputPaths(src, src + "/sub/../").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputPaths(src, src + "/new/out").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputPaths(src, src + "/sub").code(),
            absl::StatusCode::kInvalidArgument);
  // A sibling whose name starts like the source is fine.
  EXPECT_TRUE(CheckOutputPaths(src, src + "2").ok());
  EXPECT_EQ(CheckOutputPaths(src, src + "/keep.txt").code(),
            absl::StatusCode::kInvalidArgument);
  const std::string other = mneme::testing::MakeTempDir("exists");
  EXPECT_EQ(CheckOutputPaths(src, other).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckOutputPaths("/nonexistent/x", other + "/o").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckOutputPaths(src + "/keep.txt", other + "/o").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOutputPaths(src, "").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PartialOutputDirTest, LinksWritesResumesAndCommits) {
  const std::string src = MakeTree();
  const std::string out = mneme::testing::MakeTempDir("out") + "/a/b/out";
  const OutputDirOptions options{
      .source_dir = src, .out_dir = out, .tool = "t", .identity = {{"x", 1}}};
  {
    auto dir = PartialOutputDir::Open(options);
    ASSERT_TRUE(dir.ok()) << dir.status();
    EXPECT_FALSE((*dir)->resumed());
    EXPECT_EQ((*dir)->path(), out + ".partial");
    ASSERT_TRUE((*dir)->SaveState({{"step", 3}}).ok());
    // Interrupted here.
  }
  // Other options: refused; same: resumed with the state.
  OutputDirOptions other = options;
  other.identity = {{"x", 2}};
  EXPECT_EQ(PartialOutputDir::Open(other).status().code(),
            absl::StatusCode::kFailedPrecondition);
  other = options;
  other.tool = "u";
  EXPECT_EQ(PartialOutputDir::Open(other).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto dir = PartialOutputDir::Open(options);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE((*dir)->resumed());
  EXPECT_EQ((*dir)->state()["step"], 3);

  ASSERT_TRUE((*dir)->WriteFile("config.json", "{\"new\": true}").ok());
  ASSERT_TRUE((*dir)->LinkSourceFiles({"config.json"}).ok());
  ASSERT_TRUE((*dir)->LinkSourceFiles({"config.json"}).ok());  // Idempotent.
  EXPECT_FALSE(fs::exists(out));
  ASSERT_TRUE((*dir)->Commit().ok());
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_FALSE(fs::exists(out + "/.mneme-journal.json"));
  EXPECT_EQ(ReadFile(out + "/config.json"), "{\"new\": true}");
  EXPECT_EQ(ReadFile(src + "/config.json"), "{}");
  EXPECT_EQ(Inode(out + "/keep.txt"), Inode(src + "/keep.txt"));
  EXPECT_EQ(Inode(out + "/sub/nested.bin"), Inode(src + "/sub/nested.bin"));
  EXPECT_TRUE(fs::is_symlink(out + "/alias.txt"));
  EXPECT_EQ(ReadFile(out + "/alias.txt"), "keep");
}

TEST(PartialOutputDirTest, RefusesAForeignPartialDirectory) {
  const std::string src = MakeTree();
  const std::string out = mneme::testing::MakeTempDir("foreign") + "/out";
  fs::create_directories(out + ".partial");
  std::ofstream(out + ".partial/.mneme-journal.json") << "not json";
  auto dir = PartialOutputDir::Open(
      {.source_dir = src, .out_dir = out, .tool = "t", .identity = nullptr});
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadFile(out + ".partial/.mneme-journal.json"), "not json");
}

TEST(SourceFingerprintTest, ChangesWithTheFiles) {
  const std::string src = MakeTree();
  const nlohmann::json a = SourceFingerprint(src);
  // Regular files at the top, links followed (Hugging Face cache
  // directories are links to blobs): alias.txt, config.json, keep.txt.
  EXPECT_EQ(a.size(), 3u);
  std::ofstream(src + "/keep.txt") << "changed, longer";
  EXPECT_NE(SourceFingerprint(src), a);
}

}  // namespace
}  // namespace mneme::quant
