#ifndef MNEME_SERVICES_COMMON_SYSTEMD_NOTIFIER_H_
#define MNEME_SERVICES_COMMON_SYSTEMD_NOTIFIER_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace mneme {

// Tells systemd (Type=notify units) about the daemon's state through
// sd_notify: READY=1 once serving, STOPPING=1 when draining, STATUS= text,
// and WATCHDOG=1 pings at half the interval systemd asks for
// (WATCHDOG_USEC). Everything is a no-op when not run under systemd
// (NOTIFY_SOCKET unset). Thread-safe.
class SystemdNotifier {
 public:
  SystemdNotifier() = default;
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;
  // Stops the watchdog thread.
  ~SystemdNotifier();

  void Ready();
  void Stopping();
  void Status(absl::string_view text);

  // Starts pinging WATCHDOG=1 if systemd asked for a watchdog; a ping is
  // sent only while `healthy()` returns true (so a wedged daemon gets
  // restarted). Idempotent. Returns the ping interval (zero: no watchdog).
  absl::Duration StartWatchdog(std::function<bool()> healthy);

 private:
  void Send(absl::string_view state);

  absl::Mutex mu_;
  std::thread watchdog_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
};

}  // namespace mneme

#endif  // MNEME_SERVICES_COMMON_SYSTEMD_NOTIFIER_H_
