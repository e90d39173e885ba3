#ifndef MNEME_ENGRAM_STORE_SERVICE_SHM_SERVER_H_
#define MNEME_ENGRAM_STORE_SERVICE_SHM_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "engram_store/service/request_handler.h"

namespace mneme::engram {

struct ShmServerOptions {
  // The Unix socket to listen on. Required. A stale socket file there (a
  // previous run's) is replaced; any other file is an error.
  std::string socket_path;
  // Permission bits of the socket file: who may connect. Default: 0660.
  int socket_mode = 0660;
  // Connections served at once; more are closed on accept. Default: 64.
  int max_connections = 64;
  // Shared area per connection: the largest request proto, and the rows
  // (plus 8 bytes of row id each) of one response piece; larger lookups
  // come in several pieces. Defaults: 4 MiB, 64 MiB (address space; pages
  // are touched as used).
  uint64_t request_bytes = uint64_t{4} << 20;
  uint64_t response_bytes = uint64_t{64} << 20;
  // How long a connection's thread spins on its mailbox after a call before
  // it blocks on the socket: a worker's next message within this time is
  // taken without waking a thread (microseconds instead of tens). A decode
  // step's lookups are milliseconds apart, so a long spin mostly burns a
  // core (measured on 2 vCPUs: 200 us slowed the worker's step). In [0,
  // 10 ms] (a spinning thread does not watch the socket); zero: never spin.
  // Default: 20 us.
  absl::Duration spin = absl::Microseconds(20);
  // Deadline of a call that names none (or a later one). Default: 10 s.
  absl::Duration default_timeout = absl::Seconds(10);
};

// Serves the Engram store API to workers on the same node through shared
// memory (engram_store/shm/shm_wire.h): one thread per connection, each
// call answered by the same RequestHandler as the gRPC service (the same
// validation, limits and errors), admitted through the same InflightGate
// (a draining store answers Unavailable), recorded in
// mneme_engram_shm_calls_total{method,code}, mneme_engram_shm_rows_total and
// mneme_engram_shm_call_seconds. A client that sends anything malformed
// loses its connection; the store carries on. Thread-safe.
class ShmEngramServer {
 public:
  // Binds and starts accepting. InvalidArgument for bad options; Internal /
  // FailedPrecondition (naming the path) when the socket cannot be made.
  // `handler`, `gate` and `metrics` (may be null) are borrowed and must
  // outlive the server.
  static absl::StatusOr<std::unique_ptr<ShmEngramServer>> Create(
      const ShmServerOptions& options, const RequestHandler* handler,
      InflightGate* gate, MetricsRegistry* metrics);

  ShmEngramServer(const ShmEngramServer&) = delete;
  ShmEngramServer& operator=(const ShmEngramServer&) = delete;
  // Shutdown().
  ~ShmEngramServer();

  // Stops accepting, closes every connection (their calls end), joins the
  // threads and removes the socket file. Idempotent.
  void Shutdown();

  const std::string& socket_path() const { return options_.socket_path; }
  // Connections open now.
  int connections() const;

 private:
  struct Metrics;
  struct Connection;

  ShmEngramServer(const ShmServerOptions& options,
                  const RequestHandler* handler, InflightGate* gate);

  void AcceptLoop();
  void Serve(Connection* connection);
  void Record(const char* method, int code, int64_t rows,
              absl::Time start) const;

  const ShmServerOptions options_;
  const RequestHandler* const handler_;
  InflightGate* const gate_;
  std::unique_ptr<Metrics> metrics_;
  int listen_fd_ = -1;
  // Written to by Shutdown to wake the accept loop.
  int wake_fds_[2] = {-1, -1};
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_SERVICE_SHM_SERVER_H_
