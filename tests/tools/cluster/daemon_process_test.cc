// DaemonProcess: output appended to the log and read per run, exit
// descriptions, exec failures, the child's own process group and signal
// mask, SIGTERM then SIGKILL on Stop.

#include "tools/cluster/daemon_process.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace mneme::cluster {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<DaemonProcess> StartShell(const std::string& script,
                                          const std::string& log) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> p =
      DaemonProcess::Start({{"/bin/sh", "-c", script}, log});
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

// Polls FindLine until the line shows up (the test's timeout bounds it).
std::string WaitForLine(const DaemonProcess& p, const std::string& prefix) {
  while (true) {
    if (std::optional<std::string> line = p.FindLine(prefix)) return *line;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::string LogPath(const std::string& name) {
  return mneme::testing::MakeTempDir("daemon") + "/" + name + ".log";
}

TEST(DaemonProcessTest, FindsLinesAndStopsWithSigterm) {
  // The launcher blocks these; the child must not inherit that.
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  std::unique_ptr<DaemonProcess> p = StartShell(
      "echo hello; echo 'listening on 127.0.0.1:4242'; exec sleep 1000",
      LogPath("a"));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(WaitForLine(*p, "listening on "), "127.0.0.1:4242");
  EXPECT_EQ(p->FindLine("metrics on "), std::nullopt);
  EXPECT_FALSE(p->Exited());
  EXPECT_EQ(p->ExitDescription(), "is running");
  // Its own process group: a terminal's Ctrl-C does not reach it.
  EXPECT_EQ(getpgid(p->pid()), p->pid());
  p->Stop(absl::Seconds(60));
  EXPECT_TRUE(p->Exited());
  EXPECT_EQ(p->ExitDescription(), "was killed by signal 15 (SIGTERM)");
  EXPECT_EQ(kill(p->pid(), 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(DaemonProcessTest, ExitStatusAndLogTail) {
  std::unique_ptr<DaemonProcess> p =
      StartShell("echo one; echo two; echo boom >&2; exit 3", LogPath("b"));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->WaitForExit(absl::InfiniteDuration()));
  EXPECT_TRUE(p->Exited());
  EXPECT_EQ(p->ExitDescription(), "exited with status 3");
  EXPECT_EQ(p->LogTail(2), "two\nboom");
  EXPECT_EQ(p->LogTail(10), "one\ntwo\nboom");
}

TEST(DaemonProcessTest, StdinIsEmpty) {
  std::unique_ptr<DaemonProcess> p =
      StartShell("if read x; then echo got; else echo eof; fi", LogPath("c"));
  ASSERT_NE(p, nullptr);
  p->WaitForExit(absl::InfiniteDuration());
  EXPECT_EQ(p->LogTail(1), "eof");
}

TEST(DaemonProcessTest, EachRunReadsOnlyItsOwnOutput) {
  const std::string log = LogPath("d");
  std::unique_ptr<DaemonProcess> first =
      StartShell("echo 'listening on first'", log);
  ASSERT_NE(first, nullptr);
  first->WaitForExit(absl::InfiniteDuration());
  std::unique_ptr<DaemonProcess> second =
      StartShell("echo 'listening on second'; exec sleep 1000", log);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(WaitForLine(*second, "listening on "), "second");
  EXPECT_EQ(first->FindLine("listening on "), "first");
  std::ifstream in(log);
  std::string all((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "listening on first\nlistening on second\n");
}

TEST(DaemonProcessTest, StopEscalatesToSigkill) {
  std::unique_ptr<DaemonProcess> p =
      StartShell("trap '' TERM; echo ready; exec sleep 1000", LogPath("e"));
  ASSERT_NE(p, nullptr);
  WaitForLine(*p, "ready");
  p->Stop(absl::Milliseconds(200));
  EXPECT_TRUE(p->Exited());
  EXPECT_EQ(p->ExitDescription(), "was killed by signal 9 (SIGKILL)");
}

TEST(DaemonProcessTest, DestructorKillsAndReaps) {
  pid_t pid;
  {
    std::unique_ptr<DaemonProcess> p =
        StartShell("exec sleep 1000", LogPath("f"));
    ASSERT_NE(p, nullptr);
    pid = p->pid();
  }
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

TEST(DaemonProcessTest, MissingExecutableIsNotFound) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> p =
      DaemonProcess::Start({{"/nonexistent/mneme_worker"}, LogPath("g")});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("/nonexistent/mneme_worker"));
}

TEST(DaemonProcessTest, NonExecutableIsPermissionDenied) {
  const std::string dir = mneme::testing::MakeTempDir("daemon");
  const std::string path = dir + "/not_executable";
  std::ofstream(path) << "#!/bin/sh\n";
  chmod(path.c_str(), 0644);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> p =
      DaemonProcess::Start({{path}, dir + "/h.log"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(p.status().message(), HasSubstr(path));
}

TEST(DaemonProcessTest, UnwritableLogIsAnError) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> p =
      DaemonProcess::Start({{"/bin/true"}, "/nonexistent/dir/x.log"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("/nonexistent/dir/x.log"));
}

TEST(DaemonProcessTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(DaemonProcess::Start({{}, LogPath("i")}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DaemonProcess::Start({{"/bin/true"}, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::cluster
