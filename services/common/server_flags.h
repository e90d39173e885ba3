#ifndef MNEME_SERVICES_COMMON_SERVER_FLAGS_H_
#define MNEME_SERVICES_COMMON_SERVER_FLAGS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_channel.h"
#include "services/common/server_runner.h"

namespace mneme {

// ServerOptions from the flags every daemon shares:
//   --listen=HOST:PORT (default 127.0.0.1:<default_port>; port 0 = any free),
//   --tls_cert, --tls_key, --tls_client_ca (PEM files; see ServerTlsOptions),
//   --cluster_secret_file (see common/cluster_secret.h),
//   --drain_timeout (e.g. 30s), --max_message_bytes,
//   --metrics_listen=HOST:PORT|none (default 127.0.0.1:<default_metrics_port>
//   when given, else none).
// InvalidArgument naming the flag on a malformed value.
// With --check_config: prints "<daemon>: config ok" and exits 0. Call once
// every flag has been turned into options (each of which exits 1 with the
// error on a bad value) and before any I/O.
void ExitIfCheckConfig(absl::string_view daemon);

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(
    int default_port, std::optional<int> default_metrics_port = std::nullopt);

// How a daemon's channels to its peers (coordinator -> workers, worker ->
// rank 0's rendezvous service and -> the Engram store) are secured:
// --peer_tls_ca (set to use TLS), --peer_tls_cert + --peer_tls_key (mutual
// TLS), --peer_tls_server_name (the name checked against the peer's
// certificate), and the same --cluster_secret_file the server checks.
// Only tls and cluster_secret_file are set. InvalidArgument naming the flag
// when only one of --peer_tls_cert/--peer_tls_key is given or they are given
// without --peer_tls_ca. Files are not opened here.
absl::StatusOr<ClientChannelOptions> PeerChannelOptionsFromFlags();

}  // namespace mneme

#endif  // MNEME_SERVICES_COMMON_SERVER_FLAGS_H_
