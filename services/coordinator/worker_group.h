#ifndef MNEME_SERVICES_COORDINATOR_WORKER_GROUP_H_
#define MNEME_SERVICES_COORDINATOR_WORKER_GROUP_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "proto/worker/v1/worker.pb.h"

namespace mneme::coordinator {

// The gRPC error_details a worker sets on a Step error after which its group
// is intact and nothing changed on any rank (an Engram store fault agreed on
// by every rank; services/worker/worker_service.h kStepNotRunDetails).
inline constexpr absl::string_view kStepNotRunDetails =
    "mneme.worker.v1.step_not_run";
inline constexpr absl::string_view kStepNotRunPayload =
    "type.mneme.dev/step_not_run";

// UNAVAILABLE for a step that did not run while the group stays whole: its
// requests fail (or are retried), the other requests keep their state.
inline absl::Status StepNotRunError(absl::string_view message) {
  absl::Status st = absl::UnavailableError(message);
  st.SetPayload(kStepNotRunPayload, absl::Cord("1"));
  return st;
}
inline bool IsStepNotRun(const absl::Status& status) {
  return status.GetPayload(kStepNotRunPayload).has_value();
}

// The coordinator's view of a tensor-parallel worker group: one step plan
// runs on every rank at once, and the group answers as one. The engine
// talks to the workers only through this interface; GrpcWorkerGroup is the
// real one, tests use a fake. Implementations are thread-safe (calls may
// overlap; the engine issues one Step at a time) and give every call a
// deadline.
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;

  // Ranks in the group (>= 1).
  virtual int size() const = 0;

  // Runs `request` on every rank; rank 0's response (every rank computes the
  // same; the others answer only their sampled tokens, and DATA_LOSS when
  // they differ from rank 0's: the ranks are out of step, and the group's
  // sequences are as good as gone). Otherwise the most telling error of any
  // rank, naming it:
  // UNAVAILABLE when a rank is unreachable, timed out or its group broke
  // (the workers' sequences are then gone); INVALID_ARGUMENT /
  // RESOURCE_EXHAUSTED when the plan was refused, which changes nothing on
  // any rank; a StepNotRunError (UNAVAILABLE) when every failing rank
  // reported that the step did not run and the group is intact (an Engram
  // store fault).
  virtual absl::StatusOr<worker::v1::StepResponse> Step(
      const worker::v1::StepRequest& request) = 0;

  // A step started with StartStep.
  class PendingStep {
   public:
    virtual ~PendingStep() = default;
    // The step's outcome, as Step returns it; call once.
    virtual absl::StatusOr<worker::v1::StepResponse> Wait() = 0;
  };
  // Starts `request` on every rank. With pipelined(), returns at once and
  // the workers run the started steps one after another in the order they
  // were started, so that step N+1 (whose chunks may start with the tokens
  // step N samples, SequenceChunk.starts_with_sampled_token) can be sent
  // while step N runs; Wait for the steps in the order they were started.
  // The default runs Step() before returning.
  virtual std::unique_ptr<PendingStep> StartStep(
      const worker::v1::StepRequest& request) {
    return std::make_unique<DoneStep>(Step(request));
  }
  // Whether StartStep sends a step without waiting for it (see there).
  virtual bool pipelined() const { return false; }

  // GetInfo of every rank, rank order. UNAVAILABLE naming the first rank
  // that does not answer or is not ready; FAILED_PRECONDITION when a rank
  // reports another rank or group size than its place in the group.
  virtual absl::StatusOr<std::vector<worker::v1::GetInfoResponse>> Info() = 0;

  // Has every rank leave its group and join group generation `generation`
  // together (worker.proto JoinGroup): every sequence on the workers is
  // forgotten, the weights stay. OK once every rank joined; otherwise the
  // first rank's error, naming it (the group is then still not whole: the
  // caller retries with a new generation).
  virtual absl::Status JoinGroup(int64_t generation) = 0;

 protected:
  // A step whose outcome is known.
  class DoneStep final : public PendingStep {
   public:
    explicit DoneStep(absl::StatusOr<worker::v1::StepResponse> outcome)
        : outcome_(std::move(outcome)) {}
    absl::StatusOr<worker::v1::StepResponse> Wait() override {
      return std::move(outcome_);
    }

   private:
    absl::StatusOr<worker::v1::StepResponse> outcome_;
  };
};

// Whether the ranks' GetInfo answers describe one intact group: every rank
// in a group, all of the same generation (a single rank is always whole).
inline bool GroupIsWhole(const std::vector<worker::v1::GetInfoResponse>& info) {
  if (info.size() <= 1) return true;
  for (const worker::v1::GetInfoResponse& w : info) {
    if (!w.in_group() ||
        w.group_generation() != info.front().group_generation()) {
      return false;
    }
  }
  return true;
}

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_WORKER_GROUP_H_
