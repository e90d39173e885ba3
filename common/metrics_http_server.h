#ifndef MNEME_COMMON_METRICS_HTTP_SERVER_H_
#define MNEME_COMMON_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace mneme {

struct MetricsHttpServerOptions {
  // Host name or literal address to listen on ("0.0.0.0" or "::" for every
  // interface). Default: "127.0.0.1".
  std::string host = "127.0.0.1";
  // TCP port, 0..65535; 0 picks a free port (see MetricsHttpServer::port()).
  // Default: 0.
  int port = 0;
  // Threads answering requests, 1..64. Default: 2.
  int num_threads = 2;
  // Accepted connections waiting for a free thread, 1..4096; past it the
  // server stops accepting until one is taken (new connections then wait in
  // the kernel's listen backlog). Default: 64.
  int max_queued_connections = 64;
  // Per-connection read and write timeout, and how long an idle keep-alive
  // connection is kept, in seconds, 1..3600. Stop() may wait this long for
  // a request being read. Default: 5.
  int io_timeout_seconds = 5;
};

// Serves a MetricsRegistry over HTTP for Prometheus, plus liveness and
// readiness probes (Kubernetes, load balancers):
//   GET /metrics  200, the registry in the text format 0.0.4
//                 (Content-Type: text/plain; version=0.0.4; charset=utf-8)
//   GET /healthz  200 "ok" while the process serves at all
//   GET /readyz   200 "ready" while the readiness callback returns true,
//                 503 "not ready" otherwise
// Anything else is 404.
//
// Call order: Create() (binds and starts serving on its own threads) -> ...
// -> Stop() (or let the destructor stop). The registry and whatever the
// readiness callback uses are borrowed and must outlive the server.
// Thread-safe.
class MetricsHttpServer {
 public:
  // Answers /readyz; called on a server thread for every probe, so it must be
  // thread-safe and cheap.
  using ReadinessCallback = std::function<bool()>;

  // Validates `options`, binds the listen address and starts serving.
  // InvalidArgument naming the field for bad options, a null registry or an
  // empty callback; Unavailable naming the address when it cannot be bound
  // (in use, not a local address, cannot be resolved).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Create(
      const MetricsHttpServerOptions& options, const MetricsRegistry* registry,
      ReadinessCallback ready);

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;
  // Stops.
  ~MetricsHttpServer();

  // The port actually bound (the kernel's pick when options.port was 0).
  int port() const { return port_; }

  // Stops accepting, finishes the requests in progress and joins the server
  // threads. Idempotent; blocks until stopped.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  MetricsHttpServer(std::unique_ptr<httplib::Server> server, int port);
  // Starts the accept loop on thread_ and waits until it runs.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<httplib::Server> server_;
  const int port_;
  absl::Mutex mu_;
  // Runs the accept loop; joined by Stop().
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  // Set by thread_ when the accept loop has ended.
  std::atomic<bool> listen_returned_{false};
};

}  // namespace mneme

#endif  // MNEME_COMMON_METRICS_HTTP_SERVER_H_
