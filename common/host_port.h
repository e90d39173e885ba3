#ifndef MNEME_COMMON_HOST_PORT_H_
#define MNEME_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme {

// A listen or connect address: "HOST:PORT", "[IPV6]:PORT".
struct HostPort {
  // Host name or literal address, without brackets.
  std::string host;
  // 0..65535; 0 asks the kernel for a free port when listening.
  int port = 0;

  // "host:port", with brackets around IPv6 literals.
  std::string ToString() const;
};

// Parses "HOST:PORT". InvalidArgument naming `what` (e.g. "--listen") when the
// host is empty, the port is missing, not a number or out of range.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       absl::string_view what);

// Checks that `address` can be bound for listening right now (resolves the
// host and binds a TCP socket, then closes it), so a daemon can refuse a bad
// --listen with one clear error. Unavailable with the system's reason.
absl::Status CheckBindable(const HostPort& address, absl::string_view what);

}  // namespace mneme

#endif  // MNEME_COMMON_HOST_PORT_H_
