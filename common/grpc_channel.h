#ifndef MNEME_COMMON_GRPC_CHANNEL_H_
#define MNEME_COMMON_GRPC_CHANNEL_H_

#include <grpcpp/channel.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace mneme {

// How every Mneme gRPC client channel is built: the coordinator's to its
// workers, a worker's to the rendezvous store and to the Engram store, and the
// tools'. One place sets transport security, the receive limit and keepalive.
struct ClientChannelOptions {
  // Transport security. Default: all empty (plaintext), or the process's
  // peer defaults (SetPeerChannelDefaults) when those are set.
  ClientTlsOptions tls;
  // A cluster secret file (common/cluster_secret.h): its first secret is sent
  // as kClusterSecretMetadataKey on every call. Default: "" (none, or the
  // process's peer default).
  std::string cluster_secret_file;
  // An API key sent as "authorization: Bearer <api_key>" on every call (the
  // coordinator's public Serving API). Default: "" (none).
  std::string api_key;
  // Largest message the client accepts, in bytes; must be >= 1. Default:
  // 4 MiB (gRPC's own default).
  int64_t max_receive_message_bytes = 4 << 20;
  // Interval of HTTP/2 keepalive pings while calls are active, so a peer that
  // vanished without closing its socket fails the calls instead of leaving
  // them hanging until their deadline. Zero disables keepalive. Default: 0.
  absl::Duration keepalive_time = absl::ZeroDuration();
  // How long a keepalive ping may go unanswered before the channel is closed;
  // must be positive when keepalive_time is. Default: 20 s.
  absl::Duration keepalive_timeout = absl::Seconds(20);
};

// Process-wide defaults for the channels of a daemon to its peers, set once
// from the daemon's flags (--peer_tls_*, --cluster_secret_file) before any
// channel is built, so that channels built deep inside libraries (the
// rendezvous store, the Engram client) carry them: CreateClientChannel uses
// `defaults.tls` when options.tls is all empty, and
// `defaults.cluster_secret_file` when options.cluster_secret_file is empty.
// Only tls and cluster_secret_file of `defaults` are used.
void SetPeerChannelDefaults(const ClientChannelOptions& defaults);

// A channel to `target` ("host:port"). InvalidArgument for an empty target or
// an invalid option (naming the field); the TLS errors of
// MakeChannelCredentials (NotFound / PermissionDenied naming the file) and of
// ReadClusterSecretFile. The
// channel connects lazily: creating it never blocks.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& target, const ClientChannelOptions& options);

}  // namespace mneme

#endif  // MNEME_COMMON_GRPC_CHANNEL_H_
