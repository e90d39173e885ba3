#ifndef MNEME_TOOLS_CLUSTER_DAEMON_BINARIES_H_
#define MNEME_TOOLS_CLUSTER_DAEMON_BINARIES_H_

#include <string>

#include "absl/status/statusor.h"

namespace mneme::cluster {

// Paths of the three daemons a local cluster runs.
struct DaemonBinaries {
  // mneme_engram_store.
  std::string engram_store;
  // mneme_worker.
  std::string worker;
  // mneme_coordinator.
  std::string coordinator;
};

// Where FindDaemonBinaries() looks. Every field may be empty (skipped).
struct DaemonBinarySearch {
  // A directory holding all three binaries (--bin-dir). When set it is the
  // only place looked at. Default: empty.
  std::string bin_dir;
  // The running executable (its resolved path, /proc/self/exe): its
  // directory (an install directory) and the Bazel layout around it
  // (bazel-bin/tools/mneme -> bazel-bin/services/<area>/<binary>) are
  // searched. Default: empty.
  std::string self_exe;
  // Runfiles roots ($RUNFILES_DIR, $TEST_SRCDIR): <root>/mneme/services/...
  // Default: empty.
  std::string runfiles_dir;
  std::string test_srcdir;
};

// The first place, in this order, that holds all three executables:
// bin_dir; else the directory of self_exe; else the Bazel layout relative to
// it; else <self_exe>.runfiles, runfiles_dir and test_srcdir (each
// <root>/mneme/services/{engram,worker,coordinator}/<binary>). NotFound
// naming every path tried (and the missing ones) otherwise.
absl::StatusOr<DaemonBinaries> FindDaemonBinaries(
    const DaemonBinarySearch& search);

// The DaemonBinarySearch of this process: `bin_dir`, /proc/self/exe,
// $RUNFILES_DIR and $TEST_SRCDIR.
DaemonBinarySearch DefaultDaemonBinarySearch(const std::string& bin_dir);

}  // namespace mneme::cluster

#endif  // MNEME_TOOLS_CLUSTER_DAEMON_BINARIES_H_
