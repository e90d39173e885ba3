#ifndef MNEME_SERVICES_COORDINATOR_GRPC_WORKER_GROUP_H_
#define MNEME_SERVICES_COORDINATOR_GRPC_WORKER_GROUP_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  // Steps go over one long-lived StepStream per worker, opened at the first
  // step and again after it broke (pipelined(): the engine overlaps
  // planning with the steps); false: one unary Step call per step and rank.
  // Default: true.
  bool step_stream = true;
  // Deadline of GetInfo. Default: 5 s.
  absl::Duration control_timeout = absl::Seconds(5);
  // Deadline of JoinGroup (the workers' own --comm_timeout bounds their
  // rendezvous; keep this above it). Default: 150 s.
  absl::Duration join_timeout = absl::Seconds(150);
};

// The worker group over the worker gRPC API (proto/worker/v1): each Step
// and Info call goes to every rank at once, each with its deadline; a rank
// that misses the deadline counts as lost (UNAVAILABLE). Steps go over one
// StepStream per rank (GrpcWorkerGroupOptions.step_stream): no call set-up
// per step, and steps started back to back queue on the workers in order.
// Thread-safe.
class GrpcWorkerGroup final : public WorkerGroup {
 public:
  // InvalidArgument for an empty worker list, a malformed address or a
  // timeout that is not positive.
  static absl::StatusOr<std::unique_ptr<GrpcWorkerGroup>> Create(
      const GrpcWorkerGroupOptions& options);
  ~GrpcWorkerGroup() override;

  int size() const override { return static_cast<int>(stubs_.size()); }
  const std::vector<std::string>& addresses() const { return options_.workers; }

  absl::StatusOr<worker::v1::StepResponse> Step(
      const worker::v1::StepRequest& request) override;
  std::unique_ptr<PendingStep> StartStep(
      const worker::v1::StepRequest& request) override;
  bool pipelined() const override { return options_.step_stream; }
  absl::StatusOr<std::vector<worker::v1::GetInfoResponse>> Info() override;
  absl::Status JoinGroup(int64_t generation) override;

 private:
  class RankStream;
  class StreamedStep;

  explicit GrpcWorkerGroup(const GrpcWorkerGroupOptions& options);

  // The request as sent: stamped with this coordinator's id.
  const worker::v1::StepRequest& Stamp(
      const worker::v1::StepRequest& request,
      std::optional<worker::v1::StepRequest>& stamped) const;
  // The group's answer from every rank's outcome (see WorkerGroup::Step):
  // rank 0's response; DataLoss when a rank sampled other tokens than rank 0
  // (the ranks are out of step: the engine takes the group as lost).
  absl::StatusOr<worker::v1::StepResponse> Combine(
      std::vector<grpc::Status> statuses,
      std::vector<worker::v1::StepResponse> responses) const;

  const GrpcWorkerGroupOptions options_;
  std::vector<std::unique_ptr<worker::v1::Worker::Stub>> stubs_;
  // Each rank's open StepStream (null until the first step; replaced once
  // it broke). Pending steps share them, so a replaced stream lives until
  // its steps were waited for.
  absl::Mutex streams_mu_;
  std::vector<std::shared_ptr<RankStream>> streams_
      ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_GRPC_WORKER_GROUP_H_
