#ifndef MNEME_SERVICES_COORDINATOR_SCHEDULER_H_
#define MNEME_SERVICES_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/coordinator/kv_block_pool.h"

namespace mneme::coordinator {

// The coordinator's id of a request; its sequence on the workers has the
// same id.
using RequestId = SequenceId;

struct SchedulerOptions {
  // Most tokens computed in one step, summed over its sequences (vLLM's
  // max_num_batched_tokens): a prefill chunk is at most this long.
  // Default: 8192.
  int64_t max_num_batched_tokens = 8192;
  // Most requests running at once (admitted and holding KV blocks, whether
  // prefilling or decoding; vLLM's max_num_seqs). Default: 256.
  int64_t max_num_seqs = 256;
  // Most prompt tokens one sequence computes in a step, so that one long
  // prompt does not take a whole step (vLLM's long_prefill_token_threshold).
  // 0 = only the step's budget caps a chunk. Default: 0.
  int64_t long_prefill_token_threshold = 0;
  // Draft tokens per decode step (speculative decoding, k): a decode
  // computes 1 + k tokens. At most max_num_batched_tokens - 1. Default: 0.
  int64_t num_speculative_tokens = 0;
  // Longest sequence, prompt + max_new_tokens; one such sequence must fit
  // in the KV pool on every rank. Default: 524288.
  int64_t max_context_tokens = 524288;
  // Most requests waiting (not yet running, or preempted) when a request is
  // added. Default: 1024.
  int64_t max_queued_requests = 1024;
  // Most tokens waiting to be prefilled, summed over the waiting requests,
  // when a request is added; at least max_context_tokens, so that any valid
  // request fits in an empty queue. Default: 4194304.
  int64_t max_queued_tokens = 4194304;
  // The KV cache of each rank (its bytes_per_token must be set).
  KvBlockPoolOptions kv_pool;
};

struct Request {
  RequestId id = 0;
  // At least 1.
  int64_t num_prompt_tokens = 0;
  // Tokens to generate at most; 0 = prefill the prompt and sample nothing.
  int64_t max_new_tokens = 0;
  // Whether its decodes carry drafts (num_speculative_tokens > 0): a
  // request may opt out. Default: true.
  bool speculative = true;
};

// What the worker does at the end of a chunk (the worker protocol's
// OutputKind).
enum class ChunkOutput {
  // Nothing: a prefill chunk that is not the last of its prompt.
  kNone,
  // Sample a token from the last position (and verify the drafts, if any):
  // the chunk completes the prompt, or it is a decode.
  kSample,
};

// One sequence's share of a step.
//
// A sequence's token stream is its prompt followed by the tokens it has
// generated. The step computes the stream's tokens [start_position,
// start_position + num_tokens - num_draft_tokens), then num_draft_tokens
// positions the worker fills with draft proposals.
struct ScheduledSequence {
  RequestId id = 0;
  // Stream tokens already computed; 0 starts (or, after a preemption,
  // restarts) the sequence on the workers.
  int64_t start_position = 0;
  // Tokens computed this step (a prefill chunk, or 1 + num_draft_tokens for
  // a decode); at least 1.
  int64_t num_tokens = 0;
  int64_t num_draft_tokens = 0;
  ChunkOutput output = ChunkOutput::kNone;
  // The chunk's token is the one the step before it samples, not known yet
  // when the plan was made (ScheduleAhead): the workers take the token they
  // sampled (SequenceChunk.starts_with_sampled_token).
  bool starts_with_pending_token = false;
};

struct StepPlan {
  // 1, 2, ... over the scheduler's life.
  uint64_t step_id = 0;
  // Decodes first, then prefill chunks, each group in arrival order.
  std::vector<ScheduledSequence> sequences;
  // Running requests preempted while planning this step, latest arrival
  // first: their blocks are free and they wait, at the front of the queue,
  // to be recomputed from position 0 (prompt and generated tokens alike).
  // Release their worker state before running the step.
  std::vector<RequestId> preempted;
  // Sum of sequences[i].num_tokens; at most max_num_batched_tokens.
  int64_t num_tokens = 0;
};

// One sequence's outcome of a step.
struct SequenceResult {
  RequestId id = 0;
  // Tokens the step appended to the output: 0 for a kNone chunk; for a
  // kSample chunk the sampled token plus the accepted drafts, in
  // [1, 1 + num_draft_tokens], cut after a stop token.
  int64_t num_new_tokens = 0;
  // The last new token is eos or a stop token (the caller decides which):
  // the request finishes with kStop.
  bool stopped = false;
};

struct StepResult {
  // The plan's step_id.
  uint64_t step_id = 0;
  // One per sequence of the plan, any order. Sequences aborted since the
  // plan may be left out; their results are ignored.
  std::vector<SequenceResult> sequences;
};

enum class FinishReason {
  // A stop token (or eos) was generated.
  kStop,
  // max_new_tokens were generated.
  kLength,
};

struct FinishedRequest {
  RequestId id = 0;
  FinishReason reason = FinishReason::kLength;
  int64_t num_prompt_tokens = 0;
  int64_t num_generated_tokens = 0;
};

enum class RequestPhase {
  // Queued: new, or preempted and to be recomputed.
  kWaiting,
  // Admitted: holds KV blocks, prefilling or decoding.
  kRunning,
};

struct RequestProgress {
  RequestPhase phase = RequestPhase::kWaiting;
  int64_t num_prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  int64_t num_generated_tokens = 0;
  // Stream tokens whose KV entries are computed (0 while waiting).
  int64_t num_computed_tokens = 0;
  // Times the request was preempted.
  int64_t num_preemptions = 0;
  // 0, 1, ... in the order of AddRequest calls.
  uint64_t arrival = 0;
};

// The continuous-batching policy of the coordinator (vLLM V1's, with
// chunked prefill): which sequences compute how many tokens in each step,
// and the KV blocks they hold.
//
// Each step has a token budget. Running requests come first: decodes (1 + k
// tokens), then partial prefills (the rest of the prompt, capped by the
// remaining budget and the long-prefill threshold); then waiting requests,
// first come first served, while budget and a free sequence slot remain
// and the KV pool holds their first chunk. When the pool cannot hold a
// running sequence's next tokens, the latest-arrived running request is
// preempted: its blocks are freed and it goes back to the front of the
// queue, to be recomputed from scratch with its generated tokens as part of
// its prompt. No request is admitted in a step that preempted one.
//
// Call order: AddRequest() and Abort() at any time; Schedule(), run the plan
// on the workers, OnStepDone() with its results, Schedule() again, ... A
// plan with no sequences is not a step: it needs no OnStepDone(). While a
// step runs, ScheduleAhead() may plan the one after it (overlap
// scheduling); OnStepDone() then takes the steps' results in plan order. The
// caller keeps the token ids (the scheduler counts them) and releases the
// worker state of preempted, finished and aborted sequences.
//
// Deterministic: the same calls give the same plans. No I/O.
// Thread-compatible: one scheduling loop owns it.
class Scheduler {
 public:
  // InvalidArgument naming the field for invalid options (kv_pool fields as
  // "kv_pool.<field>").
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerOptions& options);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; its arrival is the order of this call. On error
  // nothing changes: InvalidArgument for num_prompt_tokens < 1,
  // max_new_tokens < 0 or num_prompt_tokens + max_new_tokens >
  // max_context_tokens; AlreadyExists for the id of a waiting or running
  // request; ResourceExhausted when max_queued_requests or
  // max_queued_tokens would be exceeded.
  absl::Status AddRequest(const Request& request);

  // Plans the next step, allocating the KV blocks its tokens need (and
  // preempting to make room). FailedPrecondition while the previous plan's
  // OnStepDone() is due.
  absl::StatusOr<StepPlan> Schedule();

  // Plans the step after the one in flight before its results are known
  // (overlap scheduling), as Schedule() would plan it once they came
  // without a stop: every sequence of the step in flight decodes its next
  // token (starts_with_pending_token), except those whose token in flight
  // is their last (max_new_tokens). Only in the steady state where that
  // plan is certain: the step in flight decodes every running request, one
  // token each without drafts, no request waits, and the KV pool holds the
  // new tokens without preempting; otherwise (or when every sequence ends
  // with the step in flight) a plan with no sequences: wait for the results
  // and Schedule(). A sequence that stops in the step in flight has its
  // entry in this plan computed in vain; its result is ignored.
  // FailedPrecondition unless exactly one step is in flight.
  absl::StatusOr<StepPlan> ScheduleAhead();

  // Applies the results of the planned step: computed and generated tokens
  // advance; requests with a stop token or with max_new_tokens generated
  // finish and free their blocks. Returns the finished requests in plan
  // order. On error nothing changes: FailedPrecondition when no step is
  // due; InvalidArgument for a wrong step_id, an id not in the plan or
  // twice, a missing result of a live sequence, or a token count outside
  // the range its chunk allows.
  absl::StatusOr<std::vector<FinishedRequest>> OnStepDone(
      const StepResult& result);

  // Removes a waiting or running request and frees its blocks (a client
  // cancelled or disconnected). Its results in a step in flight are
  // ignored. NotFound for an id that is neither waiting nor running.
  absl::Status Abort(RequestId id);

  // The workers lost the state of every sequence (a worker was lost and
  // their group re-forms): a step in flight is dropped (its results never
  // come and no OnStepDone() is due), and every running request goes back to
  // the front of the queue in arrival order with its blocks freed, to be
  // recomputed from scratch with its generated tokens as part of its prompt,
  // as after a preemption (and counted as one). Returns their ids, in
  // arrival order.
  std::vector<RequestId> RequeueRunning();

  // NotFound for an id that is neither waiting nor running.
  absl::StatusOr<RequestProgress> GetProgress(RequestId id) const;

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Tokens the waiting requests will prefill.
  int64_t num_queued_tokens() const { return queued_tokens_; }
  // Preemptions over the scheduler's life.
  int64_t num_preemptions() const { return num_preemptions_; }
  // Whether a step's OnStepDone() is due.
  bool step_in_flight() const { return !in_flight_.empty(); }
  // Steps whose OnStepDone() is due (at most 2).
  int num_steps_in_flight() const {
    return static_cast<int>(in_flight_.size());
  }
  // Used fraction of the KV pool, all ranks together.
  double kv_usage() const { return pool_->TotalUsage(); }
  const KvBlockPool& kv_pool() const { return *pool_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct RequestState {
    RequestId id = 0;
    uint64_t arrival = 0;
    int64_t num_prompt_tokens = 0;
    int64_t max_new_tokens = 0;
    bool speculative = true;
    int64_t num_generated = 0;
    int64_t num_computed = 0;
    int64_t num_preemptions = 0;
    bool running = false;
    // Its entry in the plan being built; -1 for none.
    int64_t plan_index = -1;
  };
  // A sequence of a plan in flight.
  struct InFlight {
    ScheduledSequence entry;
    // Tells a request from a later one with the same id.
    uint64_t arrival = 0;
  };
  // A plan in flight.
  struct InFlightStep {
    uint64_t step_id = 0;
    std::vector<InFlight> seqs;
    absl::flat_hash_map<RequestId, size_t> index;
  };
  // Records `plan` (of the requests `reqs`) as in flight.
  void AddInFlight(const StepPlan& plan,
                   const std::vector<RequestState*>& reqs);

  Scheduler(const SchedulerOptions& options, std::unique_ptr<KvBlockPool> pool);

  // Stream tokens not yet computed.
  static int64_t Pending(const RequestState& r) {
    return r.num_prompt_tokens + r.num_generated - r.num_computed;
  }
  static bool IsDecode(const RequestState& r) {
    return r.num_generated > 0 && Pending(r) == 1;
  }
  // Blocks' worth of tokens to add so that `r` can compute n more.
  int64_t Growth(const RequestState& r, int64_t n) const;
  // Adds r's entry of n tokens (drafts included) to the plan; its blocks
  // are allocated.
  void AddEntry(RequestState& r, int64_t n, int64_t drafts, StepPlan& plan,
                std::vector<RequestState*>& plan_reqs);
  // Preempts running_.back(), taking back its entry in `plan` if any.
  RequestState* PreemptLatest(StepPlan& plan,
                              std::vector<RequestState*>& plan_reqs,
                              int64_t& budget);
  // Returns id's blocks, if any, to the pool.
  void FreeBlocks(RequestId id);
  // Frees r's blocks and forgets it; it must be running.
  void RemoveRunning(RequestState& r);

  const SchedulerOptions options_;
  std::unique_ptr<KvBlockPool> pool_;
  // Looked up only, never iterated: order lives in waiting_ and running_.
  absl::flat_hash_map<RequestId, std::unique_ptr<RequestState>> requests_;
  // Front = next to admit; always in arrival order, all after running_.
  std::deque<RequestState*> waiting_;
  // In arrival order, so the latest arrival is at the back.
  std::vector<RequestState*> running_;
  int64_t queued_tokens_ = 0;
  uint64_t next_arrival_ = 0;
  uint64_t next_step_id_ = 1;
  int64_t num_preemptions_ = 0;

  // Oldest first.
  std::deque<InFlightStep> in_flight_;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_SCHEDULER_H_
