#ifndef MNEME_SERVICES_COORDINATOR_GRPC_WORKER_GROUP_H_
#define MNEME_SERVICES_COORDINATOR_GRPC_WORKER_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "services/coordinator/worker_group.h"

namespace mneme::coordinator {

struct GrpcWorkerGroupOptions {
  // "host:port" of each worker, rank order. Required (>= 1).
  std::vector<std::string> workers;
  // Transport security. Default: plaintext.
  ClientTlsOptions tls;
  // The cluster secret file whose first secret every call carries
  // (common/cluster_secret.h). Default: "" (none).
  std::string cluster_secret_file;
  // This coordinator's instance id, sent in every StepRequest: the workers
  // let only the id that created a sequence run or release it, so a
  // restart must keep the id to reclaim its sequences (at most 256 bytes).
  // Default: "".
  std::string coordinator_id;
  // Deadline of one step on every rank. Default: 120 s.
  absl::Duration step_timeout = absl::Seconds(120);
  // Deadline of GetInfo. Default: 5 s.
  absl::Duration control_timeout = absl::Seconds(5);
  // Deadline of JoinGroup (the workers' own --comm_timeout bounds their
  // rendezvous; keep this above it). Default: 150 s.
  absl::Duration join_timeout = absl::Seconds(150);
};

// The worker group over the worker gRPC API (proto/worker/v1): each Step
// and Info call goes to every rank at once, each with its deadline; a rank
// that misses the deadline counts as lost (UNAVAILABLE). Thread-safe.
class GrpcWorkerGroup final : public WorkerGroup {
 public:
  // InvalidArgument for an empty worker list, a malformed address or a
  // timeout that is not positive.
  static absl::StatusOr<std::unique_ptr<GrpcWorkerGroup>> Create(
      const GrpcWorkerGroupOptions& options);

  int size() const override { return static_cast<int>(stubs_.size()); }
  const std::vector<std::string>& addresses() const { return options_.workers; }

  absl::StatusOr<worker::v1::StepResponse> Step(
      const worker::v1::StepRequest& request) override;
  absl::StatusOr<std::vector<worker::v1::GetInfoResponse>> Info() override;
  absl::Status JoinGroup(int64_t generation) override;

 private:
  explicit GrpcWorkerGroup(const GrpcWorkerGroupOptions& options)
      : options_(options) {}

  const GrpcWorkerGroupOptions options_;
  std::vector<std::unique_ptr<worker::v1::Worker::Stub>> stubs_;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_GRPC_WORKER_GROUP_H_
