#ifndef MNEME_GPU_COMM_RENDEZVOUS_SERVICE_H_
#define MNEME_GPU_COMM_RENDEZVOUS_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/inflight_gate.h"
#include "gpu/comm/in_memory_rendezvous_store.h"
#include "proto/comm/v1/rendezvous.grpc.pb.h"

namespace mneme::gpu {

struct RendezvousServiceOptions {
  // Limits of the store the service holds (key, value and total bytes, keys
  // per Get, waiting Gets). Default: InMemoryRendezvousStoreOptions's.
  InMemoryRendezvousStoreOptions store;
  // Longest a Get waits, whatever its timeout_ms and deadline ask for.
  // Default: 10 min.
  absl::Duration max_wait = absl::Minutes(10);
};

// The mneme.comm.v1.Rendezvous gRPC service (callback API) over an
// InMemoryRendezvousStore that it owns: registered on the rank-0 worker's
// gRPC server (ServerRunner) so that the group's ranks, on any node, meet
// through it with GrpcRendezvousStore. Rank 0 uses a GrpcRendezvousStore to
// its own address as well, so that every rank's keys get the same prefix
// in one place; store() is the raw store (full keys, prefixes included),
// for tests and inspection.
//
// Every call is admitted through the InflightGate (Unavailable "server is
// draining" once draining starts). Set answers inline; a Get whose keys are
// missing is parked in the store (StartGet) and answered by the Set that
// completes it, at its deadline (DeadlineExceeded), or when the call is
// cancelled, so reactors never block and no thread waits per call. Errors
// reach the caller through ToGrpcStatus with the store's codes.
//
// `gate` is borrowed and must outlive the service; the service must outlive
// the gRPC server using it. Thread-safe.
class RendezvousService final : public comm::v1::Rendezvous::CallbackService {
 public:
  // InvalidArgument naming the field for bad options or a null gate.
  static absl::StatusOr<std::unique_ptr<RendezvousService>> Create(
      const RendezvousServiceOptions& options, InflightGate* gate);

  ~RendezvousService() override;

  // The store behind the service (keys as clients sent them, prefixed).
  InMemoryRendezvousStore& store() { return *store_; }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const comm::v1::SetRequest* request,
                                comm::v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const comm::v1::GetRequest* request,
                                comm::v1::GetResponse* response) override;

 private:
  class GetReactor;

  RendezvousService(const RendezvousServiceOptions& options, InflightGate* gate)
      : options_(options), gate_(gate) {}

  const RendezvousServiceOptions options_;
  InflightGate* const gate_;
  std::unique_ptr<InMemoryRendezvousStore> store_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_RENDEZVOUS_SERVICE_H_
