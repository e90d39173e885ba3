// FindDaemonBinaries: the search order (--bin-dir alone; next to the
// executable; the Bazel output tree; runfiles) and the NotFound message
// naming what was tried.

#include "tools/cluster/daemon_binaries.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace mneme::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

void WriteFile(const std::string& path, mode_t mode) {
  std::ofstream(path) << "#!/bin/sh\n";
  chmod(path.c_str(), mode);
}

// Creates dir/mneme_engram_store, dir/mneme_worker, dir/mneme_coordinator.
void MakeFlat(const std::string& dir) {
  mkdir(dir.c_str(), 0755);
  for (const char* name :
       {"mneme_engram_store", "mneme_worker", "mneme_coordinator"}) {
    WriteFile(dir + "/" + name, 0755);
  }
}

// Creates root/services/{engram,worker,coordinator}/<binary>.
void MakeTree(const std::string& root) {
  for (const std::string& d :
       {root, root + "/services", root + "/services/engram",
        root + "/services/worker", root + "/services/coordinator"}) {
    mkdir(d.c_str(), 0755);
  }
  WriteFile(root + "/services/engram/mneme_engram_store", 0755);
  WriteFile(root + "/services/worker/mneme_worker", 0755);
  WriteFile(root + "/services/coordinator/mneme_coordinator", 0755);
}

TEST(DaemonBinariesTest, BinDirIsUsedAlone) {
  const std::string bin = mneme::testing::MakeTempDir("bin");
  MakeFlat(bin);
  const std::string exe_dir = mneme::testing::MakeTempDir("exe");
  MakeFlat(exe_dir);
  DaemonBinarySearch search;
  search.bin_dir = bin;
  search.self_exe = exe_dir + "/mneme";
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->engram_store, bin + "/mneme_engram_store");
  EXPECT_EQ(found->worker, bin + "/mneme_worker");
  EXPECT_EQ(found->coordinator, bin + "/mneme_coordinator");
}

TEST(DaemonBinariesTest, BadBinDirIsNotFoundNamingThePaths) {
  const std::string bin = mneme::testing::MakeTempDir("bin") + "/missing";
  // Binaries next to the executable do not rescue a wrong --bin-dir.
  const std::string exe_dir = mneme::testing::MakeTempDir("exe");
  MakeFlat(exe_dir);
  DaemonBinarySearch search;
  search.bin_dir = bin;
  search.self_exe = exe_dir + "/mneme";
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr("--bin-dir"));
  EXPECT_THAT(found.status().message(), HasSubstr(bin + "/mneme_worker"));
  EXPECT_THAT(found.status().message(), HasSubstr(bin + "/mneme_engram_store"));
  EXPECT_THAT(found.status().message(), Not(HasSubstr(exe_dir)));
}

TEST(DaemonBinariesTest, OneMissingBinaryIsNamed) {
  const std::string bin = mneme::testing::MakeTempDir("bin");
  MakeFlat(bin);
  std::remove((bin + "/mneme_coordinator").c_str());
  DaemonBinarySearch search;
  search.bin_dir = bin;
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(),
              HasSubstr("no " + bin + "/mneme_coordinator"));
  EXPECT_THAT(found.status().message(),
              Not(HasSubstr("no " + bin + "/mneme_worker")));
}

TEST(DaemonBinariesTest, NonExecutableFilesDoNotCount) {
  const std::string bin = mneme::testing::MakeTempDir("bin");
  MakeFlat(bin);
  chmod((bin + "/mneme_worker").c_str(), 0644);
  DaemonBinarySearch search;
  search.bin_dir = bin;
  EXPECT_EQ(FindDaemonBinaries(search).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DaemonBinariesTest, NextToTheExecutable) {
  const std::string dir = mneme::testing::MakeTempDir("install");
  MakeFlat(dir);
  DaemonBinarySearch search;
  search.self_exe = dir + "/mneme";
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->worker, dir + "/mneme_worker");
}

TEST(DaemonBinariesTest, BazelOutputTree) {
  // bazel-bin/tools/mneme -> bazel-bin/services/<area>/<binary>.
  const std::string root = mneme::testing::MakeTempDir("bazel-bin");
  MakeTree(root);
  mkdir((root + "/tools").c_str(), 0755);
  DaemonBinarySearch search;
  search.self_exe = root + "/tools/mneme";
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->engram_store, root + "/services/engram/mneme_engram_store");
  EXPECT_EQ(found->worker, root + "/services/worker/mneme_worker");
  EXPECT_EQ(found->coordinator,
            root + "/services/coordinator/mneme_coordinator");
}

TEST(DaemonBinariesTest, RunfilesTrees) {
  const std::string exe_dir = mneme::testing::MakeTempDir("exe");
  const std::string runfiles = mneme::testing::MakeTempDir("runfiles");
  MakeTree(runfiles + "/mneme");
  const std::string srcdir = mneme::testing::MakeTempDir("srcdir");
  MakeTree(srcdir + "/mneme");

  DaemonBinarySearch search;
  search.self_exe = exe_dir + "/mneme";
  search.runfiles_dir = runfiles;
  search.test_srcdir = srcdir;
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->worker, runfiles + "/mneme/services/worker/mneme_worker");

  search.runfiles_dir.clear();
  found = FindDaemonBinaries(search);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->coordinator,
            srcdir + "/mneme/services/coordinator/mneme_coordinator");

  // The executable's own directory comes first.
  MakeFlat(exe_dir);
  found = FindDaemonBinaries(search);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->coordinator, exe_dir + "/mneme_coordinator");
}

TEST(DaemonBinariesTest, NothingFoundListsEveryPlace) {
  const std::string exe_dir = mneme::testing::MakeTempDir("exe");
  DaemonBinarySearch search;
  search.self_exe = exe_dir + "/mneme";
  search.test_srcdir = mneme::testing::MakeTempDir("srcdir");
  absl::StatusOr<DaemonBinaries> found = FindDaemonBinaries(search);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr(exe_dir + "/mneme_worker"));
  EXPECT_THAT(found.status().message(), HasSubstr("Bazel output tree"));
  EXPECT_THAT(
      found.status().message(),
      HasSubstr(search.test_srcdir + "/mneme/services/worker/mneme_worker"));
  EXPECT_THAT(found.status().message(), HasSubstr("bazel build //services"));

  EXPECT_EQ(FindDaemonBinaries(DaemonBinarySearch()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DaemonBinariesTest, DefaultSearchUsesTheEnvironment) {
  const DaemonBinarySearch search = DefaultDaemonBinarySearch("/some/bin");
  EXPECT_EQ(search.bin_dir, "/some/bin");
  EXPECT_FALSE(search.self_exe.empty());
  const char* srcdir = std::getenv("TEST_SRCDIR");
  EXPECT_EQ(search.test_srcdir, srcdir != nullptr ? srcdir : "");
}

}  // namespace
}  // namespace mneme::cluster
