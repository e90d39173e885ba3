#ifndef MNEME_TOOLS_CLUSTER_DAEMON_PROCESS_H_
#define MNEME_TOOLS_CLUSTER_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mneme::cluster {

struct DaemonProcessOptions {
  // argv[0] is the executable's path (no PATH search). Required.
  std::vector<std::string> argv;
  // File that receives the child's stdout and stderr, appended to (created
  // when missing). Required.
  std::string log_path;
};

// One child process run by a launcher: stdin is /dev/null, stdout and
// stderr are appended to a log file (a file never blocks the child the way
// a full pipe would), it has its own process group (a terminal's Ctrl-C
// reaches only the launcher, which stops the children in order) and no
// blocked signals, and it is SIGKILLed by the kernel when the thread that
// started it exits (so a launcher killed outright leaves nothing behind:
// start and supervise children from one long-lived thread).
//
// Only this object reaps its child (waitpid on its pid). Not thread-safe.
class DaemonProcess {
 public:
  // Starts the child. InvalidArgument for an empty argv or log path, the
  // errno's code (e.g. NotFound, PermissionDenied) naming the path when the
  // log cannot be opened or the executable cannot be run.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const DaemonProcessOptions& options);

  // SIGKILLs and reaps a child that is still running.
  ~DaemonProcess();

  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // Whether the child has exited (reaping it when it just did).
  bool Exited();
  // "exited with status N" or "was killed by signal N (NAME)"; "is running"
  // while it runs.
  std::string ExitDescription() const;

  // The rest of the first line this run of the child wrote to the log that
  // starts with `prefix` (e.g. "listening on " -> "127.0.0.1:40001");
  // nullopt while there is none.
  std::optional<std::string> FindLine(const std::string& prefix) const;
  // The last `max_lines` lines this run of the child wrote to the log.
  std::string LogTail(int max_lines) const;

  // Sends `signal` to a child that is still running.
  void Signal(int signal);
  // Waits up to `timeout` for the child to exit; whether it did.
  bool WaitForExit(absl::Duration timeout);
  // SIGTERM, up to `timeout` for it to exit, then SIGKILL and wait.
  // Returns at once for a child that has exited.
  void Stop(absl::Duration timeout);

 private:
  DaemonProcess() = default;
  // What this run wrote to the log (from its start offset).
  std::string ReadLog() const;

  pid_t pid_ = -1;
  std::optional<int> wait_status_;
  std::string log_path_;
  int64_t log_offset_ = 0;
};

}  // namespace mneme::cluster

#endif  // MNEME_TOOLS_CLUSTER_DAEMON_PROCESS_H_
