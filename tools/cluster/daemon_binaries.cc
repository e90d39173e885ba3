#include "tools/cluster/daemon_binaries.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mneme::cluster {
namespace {

constexpr char kEngramStore[] = "mneme_engram_store";
constexpr char kWorker[] = "mneme_worker";
constexpr char kCoordinator[] = "mneme_coordinator";

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// One place the three binaries may be, and where each would be there.
struct Layout {
  std::string where;
  DaemonBinaries paths;
};

Layout Flat(const std::string& where, const std::string& dir) {
  return {
      where,
      {absl::StrCat(dir, "/", kEngramStore), absl::StrCat(dir, "/", kWorker),
       absl::StrCat(dir, "/", kCoordinator)}};
}

// <root>/services/<area>/<binary>: the Bazel output tree (root bazel-bin)
// or a runfiles tree (root <runfiles>/mneme).
Layout Tree(const std::string& where, const std::string& root) {
  return {where,
          {absl::StrCat(root, "/services/engram/", kEngramStore),
           absl::StrCat(root, "/services/worker/", kWorker),
           absl::StrCat(root, "/services/coordinator/", kCoordinator)}};
}

}  // namespace

absl::StatusOr<DaemonBinaries> FindDaemonBinaries(
    const DaemonBinarySearch& search) {
  std::vector<Layout> layouts;
  if (!search.bin_dir.empty()) {
    layouts.push_back(Flat("--bin-dir", search.bin_dir));
  } else {
    if (!search.self_exe.empty()) {
      const std::string dir = DirName(search.self_exe);
      layouts.push_back(Flat("next to the mneme executable", dir));
      layouts.push_back(Tree("the Bazel output tree", DirName(dir)));
      layouts.push_back(
          Tree("the mneme runfiles", search.self_exe + ".runfiles/mneme"));
    }
    if (!search.runfiles_dir.empty()) {
      layouts.push_back(Tree("$RUNFILES_DIR", search.runfiles_dir + "/mneme"));
    }
    if (!search.test_srcdir.empty()) {
      layouts.push_back(Tree("$TEST_SRCDIR", search.test_srcdir + "/mneme"));
    }
  }
  std::vector<std::string> tried;
  for (const Layout& layout : layouts) {
    std::vector<std::string> missing;
    for (const std::string* path :
         {&layout.paths.engram_store, &layout.paths.worker,
          &layout.paths.coordinator}) {
      if (!IsExecutableFile(*path)) missing.push_back(*path);
    }
    if (missing.empty()) return layout.paths;
    tried.push_back(
        absl::StrCat(layout.where, ": no ", absl::StrJoin(missing, ", no ")));
  }
  if (tried.empty()) tried.emplace_back("no place to look");
  return absl::NotFoundError(
      absl::StrCat("cannot find the daemon binaries (", kEngramStore, ", ",
                   kWorker, ", ", kCoordinator,
                   "); build them with `bazel build //services/...` or pass "
                   "--bin-dir DIR. Tried: ",
                   absl::StrJoin(tried, "; ")));
}

DaemonBinarySearch DefaultDaemonBinarySearch(const std::string& bin_dir) {
  DaemonBinarySearch search;
  search.bin_dir = bin_dir;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) search.self_exe.assign(exe, static_cast<size_t>(n));
  if (const char* dir = std::getenv("RUNFILES_DIR"); dir != nullptr) {
    search.runfiles_dir = dir;
  }
  if (const char* dir = std::getenv("TEST_SRCDIR"); dir != nullptr) {
    search.test_srcdir = dir;
  }
  return search;
}

}  // namespace mneme::cluster
