#ifndef MNEME_SERVICES_COMMON_SERVER_RUNNER_H_
#define MNEME_SERVICES_COMMON_SERVER_RUNNER_H_

#include <grpcpp/server.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "common/inflight_gate.h"
#include "common/tls.h"

namespace mneme {

struct ServerOptions {
  // Where to listen. Port 0 picks a free port (see ServerRunner::address()).
  // Default: 127.0.0.1:0.
  HostPort listen = {"127.0.0.1", 0};
  // Transport security. Default: plaintext.
  ServerTlsOptions tls;
  // A cluster secret file (common/cluster_secret.h): Create() reads it and
  // hands its secrets to the gate, whose Authenticate() every handler of the
  // internal services calls (the health service stays open for probes).
  // Default: "" (calls are not authenticated).
  std::string cluster_secret_file;
  // How long Drain() waits for in-flight RPCs before cancelling them.
  // Default: 30 s.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Largest message received or sent, in bytes. Default: 64 MiB.
  int max_message_bytes = 64 << 20;
  // Where to serve /metrics, /healthz and /readyz over HTTP (port 0 = any
  // free port). Default: none (no HTTP endpoint).
  std::optional<HostPort> metrics_listen;
};

// Runs a gRPC server (callback API services) with the standard
// grpc.health.v1 health service, and drains it gracefully.
//
// Call order: Create() (builds and starts serving) -> ... -> Drain() (or let
// the destructor drain). Drain: health NOT_SERVING, the gate refuses new RPCs
// (handlers answer Unavailable), in-flight RPCs get up to drain_timeout to
// finish, then the server shuts down and cancels the rest. Health RPCs keep
// being answered (NOT_SERVING) until the shutdown. Thread-safe.
class ServerRunner {
 public:
  // Validates `options`, builds credentials and starts serving `services`
  // (borrowed; they must outlive the runner and use `gate`, borrowed too).
  // InvalidArgument / NotFound for bad options or unreadable TLS or secret
  // files,
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<ServerRunner>> Create(
      const ServerOptions& options, const std::vector<grpc::Service*>& services,
      InflightGate* gate);

  ServerRunner(const ServerRunner&) = delete;
  ServerRunner& operator=(const ServerRunner&) = delete;
  ~ServerRunner();

  // The address actually bound (the real port when 0 was asked for).
  const HostPort& address() const { return address_; }

  // Sets the overall health status (e.g. NOT_SERVING while a dependency is
  // down). Ignored once draining.
  void SetServing(bool serving);
  // True from Create() until Drain() or SetServing(false).
  bool serving() const;

  // Drains and stops as described above; idempotent, blocks until stopped.
  void Drain();

 private:
  ServerRunner(const ServerOptions& options, InflightGate* gate)
      : options_(options), gate_(gate) {}

  const ServerOptions options_;
  InflightGate* const gate_;
  HostPort address_;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mneme

#endif  // MNEME_SERVICES_COMMON_SERVER_RUNNER_H_
