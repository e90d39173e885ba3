#ifndef MNEME_TESTS_TESTING_NOTIFY_SOCKET_H_
#define MNEME_TESTS_TESTING_NOTIFY_SOCKET_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace mneme::testing {

// An abstract-namespace datagram socket standing in for systemd's notify
// socket: pass env_value() as NOTIFY_SOCKET to a child and read what it
// sends (READY=1, WATCHDOG=1, STOPPING=1, ...). Not thread-safe.
class NotifySocket {
 public:
  NotifySocket();
  ~NotifySocket();
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  bool bound() const { return bound_; }
  // "@name": the abstract socket address as NOTIFY_SOCKET spells it.
  std::string env_value() const { return "@" + name_; }

  // Collects messages until one equals `want`; false after `timeout`.
  bool WaitFor(const std::string& want, absl::Duration timeout);
  // How many of the messages received so far equal `message`.
  int Count(const std::string& message) const;

 private:
  std::string name_;
  int fd_ = -1;
  bool bound_ = false;
  std::vector<std::string> received_;
};

}  // namespace mneme::testing

#endif  // MNEME_TESTS_TESTING_NOTIFY_SOCKET_H_
