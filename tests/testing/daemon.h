#ifndef MNEME_TESTS_TESTING_DAEMON_H_
#define MNEME_TESTS_TESTING_DAEMON_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace mneme::testing {

// A daemon process started by a test and the address it reported.
struct Daemon {
  std::vector<std::string> argv;
  std::unique_ptr<Subprocess> process;
  // From its "listening on HOST:PORT" line.
  std::string address;
};

// Starts d.argv (with NOTIFY_SOCKET cleared and `env` added) and waits for
// its "listening on HOST:PORT" line; a failure to start or to listen fails
// the current test (d.address stays empty).
void Launch(Daemon& d, const std::map<std::string, std::string>& env = {},
            absl::Duration timeout = absl::Seconds(60));

// Launch() of a new Daemon running `argv`.
Daemon StartDaemon(std::vector<std::string> argv,
                   const std::map<std::string, std::string>& env = {});

// The rest of the first stdout line of `process` starting with `prefix`
// (e.g. "metrics on " -> "127.0.0.1:1234"), waiting up to `timeout`; empty
// (and the test failed) if none comes.
std::string StdoutValue(Subprocess& process, const std::string& prefix,
                        absl::Duration timeout = absl::Seconds(30));

}  // namespace mneme::testing

#endif  // MNEME_TESTS_TESTING_DAEMON_H_
