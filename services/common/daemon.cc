#include "services/common/daemon.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"

namespace mneme {
namespace {

// SIGTERM / SIGINT arrive through a pipe: the handler (which may run on
// any thread, including ones libraries started before main) only writes
// the signal number; ServeUntilSignal reads it. No signal is blocked, so
// none can fall back to its default action on a thread that missed a mask.
int g_signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int signo) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  // Async-signal-safe; a full pipe means a signal is already pending.
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void InstallTerminationHandlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("pipe2");
    std::exit(1);
  }
  // Reads block; only the handler's writes are non-blocking.
  fcntl(g_signal_pipe[0], F_SETFL, 0);
  struct sigaction action = {};
  action.sa_handler = OnTerminationSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

std::string& ProgramName() {
  static auto* name = new std::string("mneme");
  return *name;
}

}  // namespace

void InitDaemon(int argc, char** argv, absl::string_view usage) {
  if (argc > 0) {
    std::string name = argv[0];
    const size_t slash = name.rfind('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
    ProgramName() = name;
  }
  absl::SetProgramUsageMessage(usage);
  // Flag names may be spelled with dashes (`--check-config`,
  // `--http-listen`) as well as absl's underscores.
  std::vector<std::string> spelled(argv, argv + argc);
  std::vector<char*> args;
  for (std::string& a : spelled) {
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t i = 2; i < end; ++i) {
        if (a[i] == '-') a[i] = '_';
      }
    }
    args.push_back(a.data());
  }
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() > 1) {
    ExitWithError(absl::InvalidArgumentError(
        std::string("unexpected argument: ") + rest[1]));
  }
  // Debian's Abseil is built without NDEBUG, which turns on the global
  // lock-order graph for every absl::Mutex: a measured 20-40% on hot lookup
  // paths. Lock order is checked by tests and thread-safety annotations.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(ProgramName().c_str());
  InstallTerminationHandlers();
}

void ExitWithError(const absl::Status& status) {
  std::fprintf(stderr, "%s: error: %s\n", ProgramName().c_str(),
               std::string(status.message()).c_str());
  std::fflush(stderr);
  std::exit(1);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartMetricsServer(
    const ServerOptions& options, const MetricsRegistry& registry,
    const ServerRunner& runner) {
  if (!options.metrics_listen.has_value()) return nullptr;
  MetricsHttpServerOptions http;
  http.host = options.metrics_listen->host;
  http.port = options.metrics_listen->port;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Create(http, &registry,
                                [&runner] { return runner.serving(); });
  if (!server.ok()) return server.status();
  std::printf("metrics on %s\n",
              HostPort{http.host, (*server)->port()}.ToString().c_str());
  std::fflush(stdout);
  return server;
}

void PrintListening(const ServerRunner& runner) {
  std::printf("listening on %s\n", runner.address().ToString().c_str());
  std::fflush(stdout);
}

int ServeUntilSignal(ServerRunner& runner, SystemdNotifier& notifier) {
  return ServeUntilSignal(runner, notifier,
                          [&runner] { return runner.serving(); });
}

int ServeUntilSignal(ServerRunner& runner, SystemdNotifier& notifier,
                     std::function<bool()> alive) {
  notifier.Ready();
  notifier.StartWatchdog(std::move(alive));
  unsigned char byte = 0;
  while (read(g_signal_pipe[0], &byte, 1) != 1) {
  }
  const int signal = byte;
  LOG(INFO) << "received " << strsignal(signal) << ", draining";
  notifier.Stopping();
  runner.Drain();
  LOG(INFO) << "stopped";
  return 0;
}

}  // namespace mneme
