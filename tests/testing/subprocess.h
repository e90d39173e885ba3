#ifndef MNEME_TESTS_TESTING_SUBPROCESS_H_
#define MNEME_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mneme::testing {

// A child process for integration tests: stdout and stderr go to files under
// $TEST_TMPDIR that the test can read while the child runs. The destructor
// kills (SIGKILL) and reaps a child that is still running.
class Subprocess {
 public:
  // Starts argv[0] (a path) with argv; `env` entries are added to (or
  // replace) the test's environment.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv,
      const std::map<std::string, std::string>& env = {});

  ~Subprocess();

  pid_t pid() const { return pid_; }
  std::string Stdout() const;
  std::string Stderr() const;

  // Waits until a stdout line starts with `prefix`; returns the whole line.
  // DeadlineExceeded after `timeout`; Aborted if the child exits first.
  absl::StatusOr<std::string> WaitForStdoutLine(const std::string& prefix,
                                                absl::Duration timeout);

  void Signal(int signal);

  // Waits for exit; the exit code, 128 + signal when killed by one, or
  // DeadlineExceeded.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string stdout_path_;
  std::string stderr_path_;
};

// Path of a runfile such as "mneme/tests/services/common/plumbing_daemon".
std::string RunfilePath(const std::string& path);

// A fresh directory under $TEST_TMPDIR.
std::string MakeTempDir(const std::string& name);

}  // namespace mneme::testing

#endif  // MNEME_TESTS_TESTING_SUBPROCESS_H_
