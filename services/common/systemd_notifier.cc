#include "services/common/systemd_notifier.h"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mneme {

SystemdNotifier::~SystemdNotifier() {
  stop_.Notify();
  std::thread watchdog;
  {
    absl::MutexLock lock(&mu_);
    watchdog = std::move(watchdog_);
  }
  if (watchdog.joinable()) watchdog.join();
}

void SystemdNotifier::Send(absl::string_view state) {
  const std::string message(state);
  // unset_environment = 0: children (none today) may notify too.
  const int rc = sd_notify(0, message.c_str());
  if (rc < 0) {
    LOG(WARNING) << "sd_notify(" << message << ") failed: " << -rc;
  }
}

void SystemdNotifier::Ready() { Send("READY=1"); }

void SystemdNotifier::Stopping() { Send("STOPPING=1"); }

void SystemdNotifier::Status(absl::string_view text) {
  Send(absl::StrCat("STATUS=", text));
}

absl::Duration SystemdNotifier::StartWatchdog(std::function<bool()> healthy) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) {
    return absl::ZeroDuration();
  }
  const absl::Duration interval = absl::Microseconds(usec) / 2;
  absl::MutexLock lock(&mu_);
  if (watchdog_.joinable()) return interval;
  watchdog_ = std::thread([this, interval, healthy = std::move(healthy)] {
    do {
      if (healthy()) Send("WATCHDOG=1");
    } while (!stop_.WaitForNotificationWithTimeout(interval));
  });
  return interval;
}

}  // namespace mneme
