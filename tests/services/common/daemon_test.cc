// Runs the plumbing daemon as a real process: readiness, watchdog and
// stopping notifications on a notify socket the test owns, SIGTERM -> exit 0,
// and one clear error line for each kind of bad startup input.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/subprocess.h"

namespace mneme {
namespace {

using ::mneme::testing::RunfilePath;
using ::mneme::testing::Subprocess;

std::string DaemonPath() {
  return RunfilePath("mneme/tests/services/common/plumbing_daemon");
}

using ::mneme::testing::NotifySocket;

TEST(DaemonTest, NotifiesReadyWatchdogAndStoppingAndExitsCleanlyOnSigterm) {
  NotifySocket notify;
  ASSERT_TRUE(notify.bound());
  auto daemon = Subprocess::Start(
      {DaemonPath(), "--listen=127.0.0.1:0"},
      {{"NOTIFY_SOCKET", notify.env_value()}, {"WATCHDOG_USEC", "200000"}});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  ASSERT_TRUE(
      (*daemon)
          ->WaitForStdoutLine("listening on 127.0.0.1:", absl::Seconds(30))
          .ok());
  EXPECT_TRUE(notify.WaitFor("READY=1", absl::Seconds(10)));
  // Pings every 100 ms (half of WATCHDOG_USEC): wait for a few.
  ASSERT_TRUE(notify.WaitFor("WATCHDOG=1", absl::Seconds(10)));
  ASSERT_TRUE(notify.WaitFor("WATCHDOG=1", absl::Seconds(10)));
  EXPECT_GE(notify.Count("WATCHDOG=1"), 2);

  (*daemon)->Signal(SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", absl::Seconds(10)));
  absl::StatusOr<int> code = (*daemon)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << (*daemon)->Stderr();
}

TEST(DaemonTest, RunsWithoutSystemd) {
  auto daemon = Subprocess::Start({DaemonPath(), "--listen=127.0.0.1:0"},
                                  {{"NOTIFY_SOCKET", ""}});
  ASSERT_TRUE(daemon.ok());
  ASSERT_TRUE(
      (*daemon)->WaitForStdoutLine("listening on", absl::Seconds(30)).ok());
  (*daemon)->Signal(SIGINT);
  absl::StatusOr<int> code = (*daemon)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

TEST(DaemonTest, ServesMetricsAndReadinessOverHttp) {
  auto daemon = Subprocess::Start(
      {DaemonPath(), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(daemon.ok());
  absl::StatusOr<std::string> line =
      (*daemon)->WaitForStdoutLine("metrics on 127.0.0.1:", absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line->substr(line->rfind(':') + 1), &port));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  httplib::Result ready = client.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  (*daemon)->Signal(SIGTERM);
  absl::StatusOr<int> code = (*daemon)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

struct BadStartup {
  std::string name;
  std::vector<std::string> args;
  std::string expected_text;
};

void PrintTo(const BadStartup& bad, std::ostream* os) { *os << bad.name; }

class DaemonBadStartupTest : public ::testing::TestWithParam<BadStartup> {};

TEST_P(DaemonBadStartupTest, ExitsNonZeroWithOneClearErrorLine) {
  std::vector<std::string> argv = {DaemonPath()};
  for (const std::string& a : GetParam().args) argv.push_back(a);
  auto daemon = Subprocess::Start(argv);
  ASSERT_TRUE(daemon.ok());
  absl::StatusOr<int> code = (*daemon)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  const std::string stderr_text = (*daemon)->Stderr();
  std::vector<std::string> lines =
      absl::StrSplit(stderr_text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << stderr_text;
  EXPECT_NE(lines[0].find(GetParam().expected_text), std::string::npos)
      << lines[0];
  EXPECT_EQ((*daemon)->Stdout(), "");
}

int BusyPort() {
  // A listening socket that stays open for the whole test binary.
  static const int port = [] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd, 1);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    return static_cast<int>(ntohs(addr.sin_port));
  }();
  return port;
}

INSTANTIATE_TEST_SUITE_P(
    BadInput, DaemonBadStartupTest,
    ::testing::Values(
        BadStartup{"UnknownFlag", {"--no_such_flag=1"}, "no_such_flag"},
        BadStartup{"StrayArgument", {"serve"}, "unexpected argument: serve"},
        BadStartup{"MalformedListen", {"--listen=localhost"}, "HOST:PORT"},
        BadStartup{"PortOutOfRange", {"--listen=127.0.0.1:70000"}, "0..65535"},
        BadStartup{"UnresolvableHost",
                   {"--listen=no-such-host.invalid:0"},
                   "cannot listen on --listen=no-such-host.invalid:0"},
        BadStartup{"PortInUse",
                   {absl::StrCat("--listen=127.0.0.1:", BusyPort())},
                   "cannot listen on --listen=127.0.0.1:"},
        BadStartup{"UnreadableCertificate",
                   {"--listen=127.0.0.1:0", "--tls_cert=/nonexistent/a.crt",
                    "--tls_key=/nonexistent/a.key"},
                   "cannot read --tls_cert=/nonexistent/a.crt"},
        BadStartup{"CertificateWithoutKey",
                   {"--listen=127.0.0.1:0", "--tls_cert=/etc/hostname"},
                   "--tls_cert and --tls_key must be given together"},
        BadStartup{"MetricsPortInUse",
                   {"--listen=127.0.0.1:0",
                    absl::StrCat("--metrics_listen=127.0.0.1:", BusyPort())},
                   "cannot listen for metrics on 127.0.0.1:"},
        BadStartup{"NegativeDrain",
                   {"--drain_timeout=-1s"},
                   "--drain_timeout must not be negative"}),
    [](const ::testing::TestParamInfo<BadStartup>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme
