#ifndef MNEME_SERVICES_COMMON_DAEMON_H_
#define MNEME_SERVICES_COMMON_DAEMON_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "services/common/server_runner.h"
#include "services/common/systemd_notifier.h"

namespace mneme {

// What every daemon's main() does first: parses flags (an unknown flag
// exits 1 with one error line), sets up logging to stderr, and installs
// SIGTERM/SIGINT handlers that hand the signal to ServeUntilSignal()
// receives them. Call before creating any thread.
void InitDaemon(int argc, char** argv, absl::string_view usage);

// Prints "PROGRAM: error: MESSAGE" as one line on stderr and exits 1. For
// startup failures (bad flags, unreadable files, unbindable addresses).
[[noreturn]] void ExitWithError(const absl::Status& status);

// Starts the HTTP /metrics, /healthz, /readyz endpoint on
// options.metrics_listen (nullptr when that is unset), ready while `runner`
// serves, and prints "metrics on HOST:PORT" on stdout. Unavailable when the
// address cannot be bound. `registry` and `runner` must outlive it.
absl::StatusOr<std::unique_ptr<MetricsHttpServer>> StartMetricsServer(
    const ServerOptions& options, const MetricsRegistry& registry,
    const ServerRunner& runner);

// Prints "listening on HOST:PORT" for the runner's bound address on stdout.
void PrintListening(const ServerRunner& runner);

// Announces readiness to systemd, feeds its watchdog while `runner` serves,
// waits for SIGTERM or SIGINT, then announces STOPPING=1 and drains.
// Returns the process exit code (0).
int ServeUntilSignal(ServerRunner& runner, SystemdNotifier& notifier);
// The same, feeding the watchdog while `alive()` returns true instead of
// while the runner serves (for a daemon whose health may be NOT_SERVING
// for a while, e.g. a coordinator waiting for its workers).
int ServeUntilSignal(ServerRunner& runner, SystemdNotifier& notifier,
                     std::function<bool()> alive);

}  // namespace mneme

#endif  // MNEME_SERVICES_COMMON_DAEMON_H_
