#ifndef MNEME_ENGRAM_STORE_SERVICE_ENGRAM_SERVICE_H_
#define MNEME_ENGRAM_STORE_SERVICE_ENGRAM_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/work_pool.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/request_handler.h"
#include "proto/engram/v1/engram_store.grpc.pb.h"

namespace mneme::engram {

struct EngramServiceOptions {
  // Row limits per request and stream message size.
  RequestLimits limits;
  // Threads doing lookups (reads and decoding) for the reactors. Default: 8.
  int worker_threads = 8;
  // Most lookup tasks waiting for a worker; past it a call is refused with
  // ResourceExhausted. Default: 1024.
  int64_t max_queued_tasks = 1024;
  // Deadline of a call that carries none. Default: 30 s.
  absl::Duration default_timeout = absl::Seconds(30);
};

// The mneme.engram.v1.EngramStore gRPC service (callback API) over an
// EngramStore. Every call is admitted through the InflightGate (Unavailable
// "server is draining" once draining starts); Lookup and LookupStream hand
// their reads to a bounded WorkPool, so reactors never block; Prefetch and
// Describe answer inline (they never block). Errors reach the caller through
// ToGrpcStatus with the codes of RequestHandler.
//
// `store`, `gate` and `metrics` (may be null) are borrowed and must outlive
// the service; the service must outlive the gRPC server using it (its
// destructor waits for queued lookups). Thread-safe.
class EngramService final : public v1::EngramStore::CallbackService {
 public:
  // InvalidArgument naming the field for bad options; AlreadyExists when
  // the service's metrics are already registered in `metrics`.
  static absl::StatusOr<std::unique_ptr<EngramService>> Create(
      const EngramServiceOptions& options, EngramStore* store,
      InflightGate* gate, MetricsRegistry* metrics);

  ~EngramService() override;

  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerWriteReactor<v1::LookupResponse>* LookupStream(
      grpc::CallbackServerContext* context,
      const v1::LookupRequest* request) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const v1::PrefetchRequest* request,
                                     v1::PrefetchResponse* response) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::DescribeResponse* response) override;

 private:
  class StreamReactor;
  struct Metrics;

  EngramService(const EngramServiceOptions& options, EngramStore* store,
                InflightGate* gate);

  absl::Time Deadline(const grpc::CallbackServerContext& context) const;
  void Record(const char* method, const absl::Status& status, size_t rows,
              absl::Time start) const;

  // What a unary call's work returns: its status and the rows it served or
  // queued (for the metrics).
  struct Outcome {
    absl::Status status;
    size_t rows = 0;
  };
  // Where a unary call's work runs: on the pool (it reads rows, so it may
  // block) or inline on the gRPC thread (it never blocks).
  enum class RunOn { kPool, kInline };
  // The one path of every unary call: admits it through the gate (UNAVAILABLE
  // while draining), runs `work` (returning an Outcome) where `run_on` says,
  // records the metrics under `method` and finishes the call. On the pool, a
  // full queue finishes it with RESOURCE_EXHAUSTED. The gate's pass is held
  // until the call finishes.
  template <typename Work>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                  const char* method, RunOn run_on, Work work);

  const EngramServiceOptions options_;
  const RequestHandler handler_;
  InflightGate* const gate_;
  std::unique_ptr<Metrics> metrics_;
  // Last member: destroyed (and drained) first, while the rest still lives.
  std::unique_ptr<WorkPool> pool_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_SERVICE_ENGRAM_SERVICE_H_
