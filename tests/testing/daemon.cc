#include "tests/testing/daemon.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace mneme::testing {

std::string StdoutValue(Subprocess& process, const std::string& prefix,
                        absl::Duration timeout) {
  absl::StatusOr<std::string> line = process.WaitForStdoutLine(prefix, timeout);
  EXPECT_TRUE(line.ok()) << line.status() << process.Stderr();
  if (!line.ok()) return "";
  return std::string(
      absl::StripAsciiWhitespace(absl::StripPrefix(*line, prefix)));
}

void Launch(Daemon& d, const std::map<std::string, std::string>& env,
            absl::Duration timeout) {
  std::map<std::string, std::string> all = env;
  all.emplace("NOTIFY_SOCKET", "");
  absl::StatusOr<std::unique_ptr<Subprocess>> p =
      Subprocess::Start(d.argv, all);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return;
  d.process = *std::move(p);
  d.address = StdoutValue(*d.process, "listening on ", timeout);
}

Daemon StartDaemon(std::vector<std::string> argv,
                   const std::map<std::string, std::string>& env) {
  Daemon d;
  d.argv = std::move(argv);
  Launch(d, env);
  return d;
}

}  // namespace mneme::testing
