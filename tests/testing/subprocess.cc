#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace mneme::testing {
namespace {

std::string TempRoot() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

std::string MakeTempDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string path =
      absl::StrCat(TempRoot(), "/", name, ".", getpid(), ".", counter++);
  mkdir(path.c_str(), 0755);
  return path;
}

std::string RunfilePath(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/", path);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv,
    const std::map<std::string, std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  auto child = std::unique_ptr<Subprocess>(new Subprocess());
  const std::string dir = MakeTempDir("subprocess");
  child->stdout_path_ = dir + "/stdout";
  child->stderr_path_ = dir + "/stderr";

  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(*e, absl::MaxSplits('=', 1));
    merged[kv.first] = kv.second;
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  env_strings.reserve(merged.size());
  for (const auto& [k, v] : merged)
    env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argvp;
  argvp.reserve(args.size() + 1);
  for (std::string& s : args) argvp.push_back(s.data());
  argvp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, child->stdout_path_.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, child->stderr_path_.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // The child starts with no signals blocked, whatever the test blocked.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  const int rc = posix_spawn(&child->pid_, argvp[0], &actions, &attr,
                             argvp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(rc)));
  }
  return child;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_.has_value()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

std::string Subprocess::Stdout() const { return ReadAll(stdout_path_); }
std::string Subprocess::Stderr() const { return ReadAll(stderr_path_); }

absl::StatusOr<std::string> Subprocess::WaitForStdoutLine(
    const std::string& prefix, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    for (absl::string_view line : absl::StrSplit(Stdout(), '\n')) {
      if (absl::StartsWith(line, prefix)) return std::string(line);
    }
    if (exit_code_.has_value()) {
      return absl::AbortedError(absl::StrCat("child exited with ", *exit_code_,
                                             "; stderr: ", Stderr()));
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      continue;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no stdout line starting with '", prefix,
                       "'; stdout: ", Stdout(), "; stderr: ", Stderr()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !exit_code_.has_value()) kill(pid_, signal);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exit_code_.has_value()) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("child did not exit in time");
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return *exit_code_;
}

}  // namespace mneme::testing
