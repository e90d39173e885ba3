#ifndef MNEME_SERVICES_COMMON_DAEMON_H_
#define MNEME_SERVICES_COMMON_DAEMON_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "services/common/server_runner.h"
#include "services/common/systemd_notifier.h"

namespace mneme {

// What every daemon's main() does first: parses flags (an unknown flag
// exits 1 with one error line), sets up logging to stderr, and blocks
// SIGTERM/SIGINT in this and every later thread so that ServeUntilSignal()
// receives them. Call before creating any thread.
void InitDaemon(int argc, char** argv, absl::string_view usage);

// Prints "PROGRAM: error: MESSAGE" as one line on stderr and exits 1. For
// startup failures (bad flags, unreadable files, unbindable addresses).
[[noreturn]] void ExitWithError(const absl::Status& status);

// Announces readiness to systemd, feeds its watchdog while `runner` serves,
// waits for SIGTERM or SIGINT, then announces STOPPING=1 and drains.
// Returns the process exit code (0).
int ServeUntilSignal(ServerRunner& runner, SystemdNotifier& notifier);

}  // namespace mneme

#endif  // MNEME_SERVICES_COMMON_DAEMON_H_
