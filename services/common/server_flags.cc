#include "services/common/server_flags.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, listen, "",
          "HOST:PORT to serve gRPC on; port 0 picks a free port (the bound "
          "address is printed as 'listening on HOST:PORT'). Default: "
          "127.0.0.1 and the daemon's fixed port.");
ABSL_FLAG(std::string, tls_cert, "",
          "Server certificate chain (PEM). With --tls_key enables TLS.");
ABSL_FLAG(std::string, tls_key, "", "Server private key (PEM).");
ABSL_FLAG(std::string, tls_client_ca, "",
          "CA bundle (PEM) for client certificates; setting it requires "
          "mutual TLS.");
ABSL_FLAG(std::string, cluster_secret_file, "",
          "File holding the cluster's shared secret (16..1024 printable "
          "ASCII bytes, e.g. `openssl rand -hex 32`; a second line holds the "
          "next secret while rotating). The daemon's internal services "
          "refuse calls without it (UNAUTHENTICATED) and its channels to "
          "peers send it. Default: none.");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "CA bundle (PEM) the peers' server certificates must chain to; "
          "set to use TLS to peers (workers, rank 0, the Engram store).");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "Client certificate chain (PEM) presented to peers (mutual TLS).");
ABSL_FLAG(std::string, peer_tls_key, "",
          "Client private key (PEM) for --peer_tls_cert.");
ABSL_FLAG(std::string, peer_tls_server_name, "",
          "Name checked against the peers' certificates instead of the "
          "host of their address.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM, how long in-flight RPCs may take before they are "
          "cancelled.");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT for the HTTP /metrics, /healthz and /readyz endpoint "
          "(port 0 picks a free port, printed as 'metrics on HOST:PORT'); "
          "'none' disables it. Default: 127.0.0.1 and the daemon's fixed "
          "metrics port.");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "Largest gRPC message received or sent, in bytes.");

ABSL_FLAG(bool, check_config, false,
          "Validate the flags (including a --flagfile) and exit (also "
          "spelled --check-config): status 0 "
          "and 'config ok' when they are valid, 1 and the error otherwise. "
          "Files the flags name are not opened.");

namespace mneme {

void ExitIfCheckConfig(absl::string_view daemon) {
  if (!absl::GetFlag(FLAGS_check_config)) return;
  std::printf("%s: config ok\n", std::string(daemon).c_str());
  std::fflush(stdout);
  std::exit(0);
}

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(
    int default_port, std::optional<int> default_metrics_port) {
  ServerOptions options;
  std::string listen = absl::GetFlag(FLAGS_listen);
  if (listen.empty()) listen = absl::StrCat("127.0.0.1:", default_port);
  absl::StatusOr<HostPort> address = ParseHostPort(listen, "--listen");
  if (!address.ok()) return address.status();
  options.listen = *address;
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.cluster_secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (options.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must not be negative");
  }
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("--max_message_bytes must be positive");
  }
  std::string metrics = absl::GetFlag(FLAGS_metrics_listen);
  if (metrics.empty() && default_metrics_port.has_value()) {
    metrics = absl::StrCat("127.0.0.1:", *default_metrics_port);
  }
  if (!metrics.empty() && metrics != "none") {
    absl::StatusOr<HostPort> metrics_address =
        ParseHostPort(metrics, "--metrics_listen");
    if (!metrics_address.ok()) return metrics_address.status();
    options.metrics_listen = *metrics_address;
  }
  return options;
}

absl::StatusOr<ClientChannelOptions> PeerChannelOptionsFromFlags() {
  ClientChannelOptions options;
  options.tls.ca_file = absl::GetFlag(FLAGS_peer_tls_ca);
  options.tls.cert_file = absl::GetFlag(FLAGS_peer_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_peer_tls_key);
  options.tls.server_name_override = absl::GetFlag(FLAGS_peer_tls_server_name);
  options.cluster_secret_file = absl::GetFlag(FLAGS_cluster_secret_file);
  if (options.tls.cert_file.empty() != options.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--peer_tls_cert and --peer_tls_key go together");
  }
  if (!options.tls.cert_file.empty() && options.tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--peer_tls_cert/--peer_tls_key need --peer_tls_ca");
  }
  if (!options.tls.server_name_override.empty() &&
      options.tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--peer_tls_server_name needs --peer_tls_ca");
  }
  return options;
}

}  // namespace mneme
