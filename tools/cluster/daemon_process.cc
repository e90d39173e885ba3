#include "tools/cluster/daemon_process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace mneme::cluster {
namespace {

// wait_status_ of a child reaped by someone else: no real wait status has
// every bit set.
constexpr int kStatusUnknown = -1;

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Runs in the child between fork() and exec: async-signal-safe calls only.
[[noreturn]] void ExecChild(pid_t parent, int stdin_fd, int log_fd,
                            int error_fd, char* const* argv) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher died before prctl took effect.
  if (getppid() != parent) _exit(127);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (dup2(stdin_fd, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0) {
    const int error = errno;
    (void)!write(error_fd, &error, sizeof(error));
    _exit(127);
  }
  // Nothing else the launcher has open leaks into the daemon (kernels
  // without close_range keep the launcher's O_CLOEXEC discipline only).
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  execve(argv[0], argv, environ);
  const int error = errno;
  (void)!write(error_fd, &error, sizeof(error));
  _exit(127);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const DaemonProcessOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("DaemonProcessOptions.argv is empty");
  }
  if (options.log_path.empty()) {
    return absl::InvalidArgumentError("DaemonProcessOptions.log_path is empty");
  }
  auto process = std::unique_ptr<DaemonProcess>(new DaemonProcess());
  process->log_path_ = options.log_path;
  const int log_fd = open(options.log_path.c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return ErrnoStatus(errno, absl::StrCat("opening ", options.log_path));
  }
  struct stat st;
  process->log_offset_ = fstat(log_fd, &st) == 0 ? st.st_size : 0;
  const int stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int error_pipe[2];
  if (stdin_fd < 0 || pipe2(error_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    close(log_fd);
    if (stdin_fd >= 0) close(stdin_fd);
    return ErrnoStatus(error, "preparing a child process");
  }
  // Everything the child needs is built before fork: it may only make
  // async-signal-safe calls.
  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecChild(parent, stdin_fd, log_fd, error_pipe[1], argv.data());
  const int fork_error = errno;
  close(error_pipe[1]);
  close(stdin_fd);
  close(log_fd);
  if (pid < 0) {
    close(error_pipe[0]);
    return ErrnoStatus(fork_error, "fork");
  }
  process->pid_ = pid;
  // The pipe closes on a successful exec; otherwise it carries the errno.
  int exec_error = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n == sizeof(exec_error)) {
    process->WaitForExit(absl::InfiniteDuration());
    return ErrnoStatus(exec_error, absl::StrCat("running ", options.argv[0]));
  }
  return process;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && !Exited()) {
    kill(pid_, SIGKILL);
    WaitForExit(absl::InfiniteDuration());
  }
}

bool DaemonProcess::Exited() {
  if (wait_status_.has_value()) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    wait_status_ = status;
  } else if (r < 0 && errno == ECHILD) {
    // Reaped elsewhere (e.g. SIGCHLD ignored): gone, status unknown.
    wait_status_ = kStatusUnknown;
  }
  return wait_status_.has_value();
}

std::string DaemonProcess::ExitDescription() const {
  if (!wait_status_.has_value()) return "is running";
  const int status = *wait_status_;
  if (status == kStatusUnknown) return "exited (status unknown)";
  if (WIFEXITED(status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return absl::StrCat("was killed by signal ", sig, " (SIG",
                        name != nullptr ? name : "?", ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

std::string DaemonProcess::ReadLog() const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "";
  in.seekg(log_offset_);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::optional<std::string> DaemonProcess::FindLine(
    const std::string& prefix) const {
  const std::string log = ReadLog();
  // Only complete lines: the daemon may be in the middle of writing one.
  const size_t end = log.rfind('\n');
  if (end == std::string::npos) return std::nullopt;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(log).substr(0, end), '\n')) {
    if (absl::StartsWith(line, prefix)) {
      return std::string(line.substr(prefix.size()));
    }
  }
  return std::nullopt;
}

std::string DaemonProcess::LogTail(int max_lines) const {
  const std::string log = ReadLog();
  std::vector<absl::string_view> lines =
      absl::StrSplit(log, '\n', absl::SkipEmpty());
  const size_t from = lines.size() > static_cast<size_t>(max_lines)
                          ? lines.size() - max_lines
                          : 0;
  return absl::StrJoin(lines.begin() + from, lines.end(), "\n");
}

void DaemonProcess::Signal(int signal) {
  if (pid_ > 0 && !Exited()) kill(pid_, signal);
}

bool DaemonProcess::WaitForExit(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    if (wait_status_.has_value()) return true;
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    wait_status_ = r == pid_ ? status : kStatusUnknown;
    return true;
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (!Exited()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

void DaemonProcess::Stop(absl::Duration timeout) {
  Signal(SIGTERM);
  if (!WaitForExit(timeout)) {
    Signal(SIGKILL);
    WaitForExit(absl::InfiniteDuration());
  }
}

}  // namespace mneme::cluster
