#ifndef MNEME_COMMON_CONNECTION_PROBE_H_
#define MNEME_COMMON_CONNECTION_PROBE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme {

// Tells whether the peer of an accepted TCP connection has gone, for servers
// that do not hand their handlers the socket (cpp-httplib gives a request's
// two endpoints only): the socket is found among this process's descriptors
// by its local and peer endpoints. The descriptor is borrowed: use the probe
// only while the connection is open (during the request's handler).
class ConnectionProbe {
 public:
  // The socket whose local endpoint is local_addr:local_port and whose peer
  // is peer_addr:peer_port (numeric IPv4 or IPv6 addresses, as the server
  // reported them). NotFound if none; InvalidArgument for a bad address.
  static absl::StatusOr<ConnectionProbe> Find(absl::string_view local_addr,
                                              int local_port,
                                              absl::string_view peer_addr,
                                              int peer_port);

  // Whether the peer closed or shut down its side (or the connection
  // failed), also behind bytes it sent before (a TLS close_notify); never
  // blocks and consumes nothing (queued bytes stay queued).
  bool PeerClosed() const;

  int fd() const { return fd_; }

 private:
  explicit ConnectionProbe(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace mneme

#endif  // MNEME_COMMON_CONNECTION_PROBE_H_
