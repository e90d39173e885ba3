#ifndef MNEME_SERVICES_WORKER_WORKER_SERVICE_H_
#define MNEME_SERVICES_WORKER_WORKER_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/work_pool.h"
#include "gpu/backend.h"
#include "gpu/comm/group_membership.h"
#include "model/model.h"
#include "model/spec/dspark.h"
#include "proto/worker/v1/worker.grpc.pb.h"

namespace mneme::worker {

// The error_details of a Step error after which the group is intact and
// nothing changed on the workers (model::IsStepNotRun, e.g. an Engram store
// fault): the coordinator fails or retries the step's requests only.
inline constexpr absl::string_view kStepNotRunDetails =
    "mneme.worker.v1.step_not_run";

// Steps of one StepStream queued or running at once; the stream reads no
// further request until one is answered (worker.proto).
inline constexpr int kMaxStreamedSteps = 4;

// Longest StepRequest/ReleaseRequest.coordinator_id, in bytes.
inline constexpr size_t kMaxCoordinatorIdBytes = 256;

struct WorkerServiceOptions {
  // Steps waiting to run; more are refused with RESOURCE_EXHAUSTED.
  // Default: 64.
  int max_queued_steps = 64;
  // Most values one response may carry: logits (OUTPUT_LOGITS_*) plus
  // log-probability values (1 + 2 N per prompt_logprobs position, 2 N per
  // sampled top list, N = top_logprobs). Default: 16,777,216 (64 MiB).
  int64_t max_response_logits = int64_t{1} << 24;
  // Called on the step thread when a step breaks the group (a peer lost, a
  // collective timed out). The worker then refuses steps (UNAVAILABLE) and
  // reports in_group=false until the coordinator's JoinGroup re-forms the
  // group; the weights stay loaded. Default: none.
  std::function<void(const absl::Status&)> on_broken;
  // Called on the step thread after JoinGroup joined `generation` (rank 0
  // erases the older generations' rendezvous keys). Default: none.
  std::function<void(int64_t generation)> on_joined;
  // Receives the worker's metrics (steps, tokens, step / collective /
  // Engram time, KV blocks); must outlive the service. Default: none.
  MetricsRegistry* metrics = nullptr;
};

// The Worker gRPC service (proto/worker/v1): runs step plans on the model,
// one at a time on its own thread, in arrival order (every rank of a group
// must get the same plans in the same order). Until Attach() every call is
// UNAVAILABLE ("not ready"). At TP > 1 steps run only while the rank is in
// a group: after Attach() once the coordinator's JoinGroup formed one. A
// step that fails in a collective breaks the group: the rank leaves it
// (closing its connections, so that peers waiting on it fail at once) and
// refuses steps until the next JoinGroup; GetInfo and JoinGroup keep
// answering.
//
// Thread-safe. `gate` is borrowed; the attached objects must outlive the
// service.
class WorkerService final : public v1::Worker::CallbackService {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerService>> Create(
      const WorkerServiceOptions& options, InflightGate* gate);
  ~WorkerService() override;
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  // Makes the service ready to run steps on `model`; `group` is the model's
  // communicator (null at TP 1), `drafter` its DSpark drafter (null: no
  // speculative decoding).
  void Attach(model::Model* model, gpu::Backend* backend,
              gpu::GroupMembership* group,
              model::DsparkDrafter* drafter = nullptr);
  // The error that broke the group; OK while it is intact (or before the
  // first JoinGroup).
  absl::Status broken() const;

  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const v1::StepRequest* request,
                                 v1::StepResponse* response) override;
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepStreamResponse>* StepStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::GetInfoRequest* request,
                                    v1::GetInfoResponse* response) override;
  grpc::ServerUnaryReactor* JoinGroup(grpc::CallbackServerContext* context,
                                      const v1::JoinGroupRequest* request,
                                      v1::JoinGroupResponse* response) override;

 private:
  WorkerService(const WorkerServiceOptions& options, InflightGate* gate);

  class StepStreamReactor;

  // A step as both Step and StepStream run it, on the step thread: the
  // readiness and ownership checks, the step, and the group's breakage when
  // it failed in a collective.
  absl::Status StepTask(const v1::StepRequest& request,
                        v1::StepResponse& response);
  // Runs on the step thread.
  absl::Status RunStep(const v1::StepRequest& request,
                       v1::StepResponse& response);
  // The tokens of chunk `index` of a step (with the sampled token it starts
  // with, if any). InvalidArgument when the chunk starts with a sampled
  // token the worker does not have.
  absl::StatusOr<std::vector<int64_t>> ChunkTokens(const v1::SequenceChunk& c,
                                                   int index) const;
  // InvalidArgument when chunk `index` (of `tokens` tokens) asks for drafts
  // it cannot have (SequenceChunk.num_draft_tokens).
  static absl::Status CheckDrafts(const v1::SequenceChunk& c, int index,
                                  size_t tokens, const model::Model& model,
                                  const model::DsparkDrafter* drafter);
  // With a drafter: asks every chunk's taps, proposes the drafts of the
  // chunks that want them (and whose history the drafter has) and appends
  // them to those chunks; returns, per chunk, the drafts' logits [k, vocab]
  // (empty: no drafts). Collective.
  absl::StatusOr<std::vector<std::vector<float>>> AddDrafts(
      const v1::StepRequest& request, const model::Model& model,
      model::DsparkDrafter* drafter, model::StepInput& input);
  // Verifies the k drafts of a chunk (their logits `draft_logits` [k,
  // vocab]) against the target's rows [1 + k, vocab], rolls the rejected
  // ones back, records the next token as the sequence's sampled token and
  // fills the result (new_tokens); returns the positions committed (1 +
  // accepted).
  absl::StatusOr<int64_t> VerifyDrafts(const v1::SequenceChunk& c,
                                       const model::SequenceChunk& chunk,
                                       absl::Span<const float> rows,
                                       absl::Span<const float> draft_logits,
                                       int k, bool full, model::Model& model,
                                       v1::ChunkResult& result);
  // Adds the first `committed` positions of a chunk to the drafter's
  // history (taps: the step's of the chunk). A sequence whose history
  // cannot be extended is dropped from the drafter and decodes without
  // drafts.
  static void ExtendDrafter(model::DsparkDrafter* drafter,
                            const model::SequenceChunk& chunk,
                            const std::vector<float>& taps, int64_t committed);
  // Forgets what the step thread keeps of a sequence besides the model's
  // state: its sampled token and its drafter history.
  void ForgetSampled(uint64_t sequence_id, model::DsparkDrafter* drafter) {
    sampled_.erase(sequence_id);
    if (drafter != nullptr) drafter->Release(sequence_id);
  }
  // OK when the shard is loaded (Attach) and, if `in_group`, the rank is in
  // an intact group.
  absl::Status Ready(bool in_group) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool InGroup() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Schedules `task` on the step thread once Ready(in_group); finishes the
  // call with RESOURCE_EXHAUSTED when the queue is full.
  template <typename Task>
  grpc::ServerUnaryReactor* Schedule(grpc::CallbackServerContext* context,
                                     bool in_group, Task task);

  struct Metrics;
  absl::Status RegisterMetrics();
  void RecordStep(const model::Model& model, absl::Duration step,
                  absl::Duration comm, int64_t tokens, bool ok);

  const WorkerServiceOptions options_;
  InflightGate* const gate_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<mneme::WorkPool> pool_;
  mutable absl::Mutex mu_;
  model::Model* model_ ABSL_GUARDED_BY(mu_) = nullptr;
  gpu::Backend* backend_ ABSL_GUARDED_BY(mu_) = nullptr;
  gpu::GroupMembership* group_ ABSL_GUARDED_BY(mu_) = nullptr;
  model::DsparkDrafter* drafter_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Sequence ownership: the coordinator id (StepRequest.coordinator_id) that
  // created each live sequence; erased when the sequence is released. A step
  // or release naming a sequence another id owns is refused
  // (PermissionDenied) before anything runs; a coordinator restarted with
  // the same id owns its sequences again.
  absl::Mutex owners_mu_;
  absl::flat_hash_map<uint64_t, std::string> owners_
      ABSL_GUARDED_BY(owners_mu_);
  absl::Status ClaimSequences(const v1::StepRequest& request);
  // The token each sequence's latest OUTPUT_SAMPLE chunk sampled, and its
  // position (SequenceChunk.starts_with_sampled_token). Step thread only;
  // erased when the sequence is released.
  struct Sampled {
    int64_t token = 0;
    int64_t position = 0;
  };
  absl::flat_hash_map<uint64_t, Sampled> sampled_;
  // PermissionDenied when a sequence of `run` or `release` is owned by
  // another id than `coordinator` (InvalidArgument for an over-long id);
  // else records `coordinator` as the owner of the new sequences of `run`
  // and forgets those of `release`.
  absl::Status CheckOwner(
      absl::string_view coordinator, absl::Span<const uint64_t> run,
      const google::protobuf::RepeatedField<uint64_t>& release);
};

}  // namespace mneme::worker

#endif  // MNEME_SERVICES_WORKER_WORKER_SERVICE_H_
