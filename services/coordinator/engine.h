#ifndef MNEME_SERVICES_COORDINATOR_ENGINE_H_
#define MNEME_SERVICES_COORDINATOR_ENGINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"
#include "proto/worker/v1/worker.pb.h"
#include "services/coordinator/generate_params.h"
#include "services/coordinator/scheduler.h"
#include "services/coordinator/worker_group.h"

namespace mneme::coordinator {

// How a generation ended.
enum class GenerateEnd {
  kStop = 0,    // eos or a stop token.
  kLength = 1,  // max_new_tokens.
  kAbort = 2,   // Aborted by the client (or its stream went away).
};

// Receives one request's events, in order, on the engine's thread. Must not
// block (a gRPC stream queues them). The order of calls:
//   [OnPromptLogprobs] ([OnTopLogprobs] OnTokens)* OnFinish
// OnPromptLogprobs comes once, when the prompt has been computed, before
// the first OnTokens (never for a request that fails or is aborted
// before); OnTopLogprobs, when asked for, right before each OnTokens, for
// the same tokens. OnFinish is the last call. A request that is preempted
// and recomputed gets no event twice.
class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  // With GenerateParams::prompt_logprobs >= 0: one entry per prompt token,
  // in prompt order; entry 0 has no logprob (nullopt) and no top.
  virtual void OnPromptLogprobs(absl::Span<const TokenLogprobs> /*positions*/) {
  }
  // With GenerateParams::top_logprobs > 0: per token of the next OnTokens,
  // its distribution's top_logprobs most likely tokens.
  virtual void OnTopLogprobs(absl::Span<const TopLogprobs> /*per_token*/) {}
  // Before OnFinish, when the request's decodes verified drafts.
  virtual void OnSpeculation(const SpeculationUsage& /*usage*/) {}
  // Returns false to end the request here (a stop string in its text):
  // it then finishes as kStop, with these tokens as its last. `logprobs`
  // (with GenerateParams::logprobs, else empty): log p of each token under
  // the unmodified model distribution.
  virtual bool OnTokens(absl::Span<const int64_t> tokens,
                        absl::Span<const float> logprobs) = 0;
  // `status` is OK for kStop / kLength / kAbort; UNAVAILABLE when the
  // workers were lost, RESOURCE_EXHAUSTED / INTERNAL for a step the workers
  // refused.
  virtual void OnFinish(const absl::Status& status, GenerateEnd end,
                        int64_t prompt_tokens, int64_t completion_tokens) = 0;
};

struct EngineOptions {
  // The scheduling policy. Its kv_pool is derived from the workers (their
  // pool bytes less max_num_seqs times the per-sequence fixed bytes, their
  // bytes per token, DCP, window); set kv_pool.bytes_per_rank > 0 here to
  // use a smaller budget than the workers have. Default: SchedulerOptions{}
  // with kv_pool.bytes_per_rank = 0.
  SchedulerOptions scheduler;
  // How often the workers are polled while the group is not ready.
  // Default: 200 ms.
  absl::Duration ready_poll_interval = absl::Milliseconds(200);
  // Prefill chunks whose Engram rows are prefetched ahead, per step.
  // Default: 4.
  int max_prefetch_hints = 4;
  // While idle, how often the workers are checked (so that health reflects
  // a lost worker before the next request). Default: 1 s.
  absl::Duration idle_check_interval = absl::Seconds(1);
  // Overlap scheduling: while a decode step runs, plan and send the next
  // one (Scheduler::ScheduleAhead; its chunks start with the tokens the
  // running step samples), so that the workers start it as soon as the
  // running one ends. Only with a pipelined() worker group. Default: true.
  bool overlap_scheduling = true;
  // How the workers verify sampled drafts (scheduler.num_speculative_tokens
  // > 0). Default: block verification.
  worker::v1::DraftVerification draft_verification =
      worker::v1::DRAFT_VERIFICATION_BLOCK;
};

struct Loads {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t waiting_tokens = 0;
  double kv_usage = 0;
  int64_t preemptions = 0;
};

// Times a request may lose its worker state (a worker lost mid-request) and
// be recomputed; once more and it fails with UNAVAILABLE.
inline constexpr int kMaxRecoveries = 3;

// The coordinator's engine: admits requests, runs the scheduler's steps on
// the worker group one after another, streams each request's tokens to its
// sink. Ready once every worker answers and their group is whole (and again
// after the group was lost and re-formed); the requests running when the
// group is lost are recomputed once it is whole again (at most
// kMaxRecoveries times each), and waiting ones stay queued.
//
// Call order: Create() -> Start() -> Submit()/Abort()* -> Stop() (or the
// destructor): Stop finishes every live request with UNAVAILABLE.
// Thread-safe. The worker group (any WorkerGroup: the gRPC one, or a fake
// in tests) and the metrics registry are borrowed.
class Engine {
 public:
  // InvalidArgument naming the option for bad options.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, WorkerGroup* workers,
      MetricsRegistry* metrics);
  ~Engine();

  void Start();
  void Stop();

  // Queues a request; returns its id. UNAVAILABLE while not ready;
  // INVALID_ARGUMENT for params that ValidateGenerateRequest refuses
  // against the served model, naming the field (nothing changes);
  // ALREADY_EXISTS for the id of a live request; RESOURCE_EXHAUSTED at the
  // admission limits.
  absl::StatusOr<std::string> Submit(GenerateParams params,
                                     std::shared_ptr<GenerateSink> sink);
  // Queues several requests (the choices of one client request) all or
  // none: on the first refusal (errors as Submit) none of them stays
  // queued and their sinks hear nothing. Returns their ids, in order.
  absl::StatusOr<std::vector<std::string>> SubmitAll(
      std::vector<GenerateParams> params,
      std::vector<std::shared_ptr<GenerateSink>> sinks);
  // Aborts a live request: its sink gets OnFinish(OK, kAbort). NotFound for
  // an unknown id.
  absl::Status Abort(const std::string& request_id);

  bool ready() const;
  // Waits up to `timeout` for ready(); returns ready().
  bool AwaitReady(absl::Duration timeout) const;
  // Whether the step loop is alive (for the watchdog).
  bool alive() const;
  // FailedPrecondition before the group was first ready.
  absl::StatusOr<ModelInfo> model_info() const;
  Loads loads() const;

 private:
  struct Live;
  struct Metrics;

  Engine(const EngineOptions& options, WorkerGroup* workers);

  absl::StatusOr<std::string> SubmitLocked(GenerateParams params,
                                           std::shared_ptr<GenerateSink> sink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step sent to the workers and not yet applied.
  struct Launched;
  void Loop();
  // Plans the next step (or waits while there is none); false when nothing
  // was launched.
  bool LaunchNext(std::deque<Launched>& flight);
  // Plans and sends the step after the one in flight, when the scheduler
  // can (overlap scheduling).
  void LaunchAhead(std::deque<Launched>& flight);
  // Fills `launched` with `plan` and returns the plan's request.
  worker::v1::StepRequest Prepare(StepPlan plan, Launched& launched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts `request` on the workers and queues `launched` behind `flight`.
  void Send(Launched launched, const worker::v1::StepRequest& request,
            std::deque<Launched>& flight);
  // Waits for the oldest step in flight and applies its outcome;
  // `previous_end`: when the step before it was answered.
  void Complete(Launched launched, absl::Time previous_end);
  // Polls the workers; re-forms their group when it is not whole; on
  // success (re)creates what depends on them.
  bool CheckReady();
  // Has the workers join a new group generation (after every generation
  // they report); the running requests are requeued to be recomputed
  // (their worker state is gone). True once every rank joined.
  bool ReformGroup(const std::vector<worker::v1::GetInfoResponse>& info);
  // The workers lost the state of every sequence: the scheduler drops the
  // step in flight and requeues the running requests to be recomputed
  // (their ids go to to_release_); a request requeued more than
  // kMaxRecoveries times fails with UNAVAILABLE instead, naming `why`.
  void RequeueRunning(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a result's drafts in the speculative-decoding metrics.
  void RecordDrafts(const worker::v1::ChunkResult& cr, Live& l)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes a live request (erasing it) with the given outcome.
  void Finish(RequestId id, const absl::Status& status, GenerateEnd end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  worker::v1::StepRequest BuildStep(const StepPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyResults(const StepPlan& plan,
                    const worker::v1::StepResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a chunk's prompt log-probabilities into its request (and hands
  // them to the sink once the prompt is complete). InternalError for a
  // result that does not match the chunk.
  absl::Status TakePromptLogprobs(Live& live, const ScheduledSequence& s,
                                  const worker::v1::ChunkResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailStep(const StepPlan& plan, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineOptions options_;
  WorkerGroup* const workers_;
  std::unique_ptr<Metrics> metrics_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_loop_ ABSL_GUARDED_BY(mu_);
  absl::Time last_worker_check_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  std::optional<ModelInfo> info_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<RequestId, std::unique_ptr<Live>> live_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, RequestId> by_name_ ABSL_GUARDED_BY(mu_);
  // Worker sequences to forget at the next step.
  std::vector<RequestId> to_release_ ABSL_GUARDED_BY(mu_);
  // Bumped whenever the workers lost every sequence: the steps launched
  // before are void (their results are dropped).
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_ENGINE_H_
