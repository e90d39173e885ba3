#ifndef MNEME_SERVICES_COORDINATOR_WORKER_GROUP_H_
#define MNEME_SERVICES_COORDINATOR_WORKER_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "proto/worker/v1/worker.grpc.pb.h"

namespace mneme::coordinator {

struct WorkerGroupOptions {
  // "host:port" of each worker, rank order. Required (>= 1).
  std::vector<std::string> workers;
  // Transport security. Default: plaintext.
  ClientTlsOptions tls;
  // Deadline of one step on every rank. Default: 120 s.
  absl::Duration step_timeout = absl::Seconds(120);
  // Deadline of GetInfo / Release. Default: 5 s.
  absl::Duration control_timeout = absl::Seconds(5);
};

// The coordinator's side of a tensor-parallel worker group: sends each step
// plan to every rank at once and collects the responses. Every call has a
// deadline. Thread-safe (calls may overlap; the coordinator's step loop
// issues one Step at a time).
class WorkerGroup {
 public:
  // InvalidArgument for an empty worker list or a malformed address.
  static absl::StatusOr<std::unique_ptr<WorkerGroup>> Create(
      const WorkerGroupOptions& options);

  int size() const { return static_cast<int>(stubs_.size()); }
  const std::vector<std::string>& addresses() const { return options_.workers; }

  // Runs `request` on every rank; rank 0's response (every rank computes the
  // same). The first error of any rank otherwise, with the rank and its
  // address in the message (UNAVAILABLE when one is unreachable or its
  // group broke; INVALID_ARGUMENT / RESOURCE_EXHAUSTED when the plan was
  // refused, which changes nothing on any rank).
  absl::StatusOr<worker::v1::StepResponse> Step(
      const worker::v1::StepRequest& request);
  // GetInfo of every rank, rank order; Unavailable naming the first rank
  // that does not answer or is not ready, FailedPrecondition when a rank
  // reports another rank or group size than its place in the list.
  absl::StatusOr<std::vector<worker::v1::GetInfoResponse>> Info();

 private:
  explicit WorkerGroup(const WorkerGroupOptions& options) : options_(options) {}

  const WorkerGroupOptions options_;
  std::vector<std::unique_ptr<worker::v1::Worker::Stub>> stubs_;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_WORKER_GROUP_H_
