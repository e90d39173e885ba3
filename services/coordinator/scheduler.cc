#include "services/coordinator/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "services/coordinator/kv_block_pool.h"

namespace mneme::coordinator {
namespace {

// Longest context accepted; keeps every sum of token counts in range.
constexpr int64_t kMaxContext = int64_t{1} << 40;

absl::Status Positive(const char* field, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be >= 1, got ", value));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    const SchedulerOptions& options) {
  for (const absl::Status& s :
       {Positive("max_num_batched_tokens", options.max_num_batched_tokens),
        Positive("max_num_seqs", options.max_num_seqs),
        Positive("max_context_tokens", options.max_context_tokens),
        Positive("max_queued_requests", options.max_queued_requests),
        Positive("max_queued_tokens", options.max_queued_tokens)}) {
    RETURN_IF_ERROR(s);
  }
  if (options.long_prefill_token_threshold < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("long_prefill_token_threshold must be >= 0, got ",
                     options.long_prefill_token_threshold));
  }
  if (options.num_speculative_tokens < 0 ||
      options.num_speculative_tokens >= options.max_num_batched_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_speculative_tokens must be in [0, max_num_batched_tokens), got ",
        options.num_speculative_tokens));
  }
  if (options.max_context_tokens > kMaxContext) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_context_tokens must be at most 2^40, got ",
                     options.max_context_tokens));
  }
  if (options.max_queued_tokens < options.max_context_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queued_tokens (", options.max_queued_tokens,
                     ") must be at least max_context_tokens (",
                     options.max_context_tokens, ")"));
  }
  absl::StatusOr<std::unique_ptr<KvBlockPool>> pool =
      KvBlockPool::Create(options.kv_pool);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrCat("kv_pool.", pool.status().message()));
  }
  for (int r = 0; r < (*pool)->dcp_size(); ++r) {
    const int64_t blocks = (*pool)->BlocksFor(r, options.max_context_tokens);
    if (blocks > (*pool)->blocks_per_rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_context_tokens (", options.max_context_tokens, ") needs ",
          blocks, " KV blocks on rank ", r, " but kv_pool holds ",
          (*pool)->blocks_per_rank(), " per rank"));
    }
  }
  return std::unique_ptr<Scheduler>(new Scheduler(options, *std::move(pool)));
}

Scheduler::Scheduler(const SchedulerOptions& options,
                     std::unique_ptr<KvBlockPool> pool)
    : options_(options), pool_(std::move(pool)) {}

absl::Status Scheduler::AddRequest(const Request& request) {
  if (request.num_prompt_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request.id, ": empty prompt"));
  }
  if (request.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", request.id, ": max_new_tokens must be >= 0, ",
                     "got ", request.max_new_tokens));
  }
  if (request.num_prompt_tokens > options_.max_context_tokens ||
      request.max_new_tokens >
          options_.max_context_tokens - request.num_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", request.id, ": prompt (", request.num_prompt_tokens,
        ") + max_new_tokens (", request.max_new_tokens,
        ") exceeds the context of ", options_.max_context_tokens, " tokens"));
  }
  if (requests_.contains(request.id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", request.id, " is already queued or running"));
  }
  if (num_waiting() >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue full: ", num_waiting(), " requests waiting"));
  }
  if (request.num_prompt_tokens > options_.max_queued_tokens - queued_tokens_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "queue full: ", queued_tokens_, " tokens waiting, the limit is ",
        options_.max_queued_tokens));
  }
  auto state = std::make_unique<RequestState>();
  state->id = request.id;
  state->arrival = next_arrival_++;
  state->num_prompt_tokens = request.num_prompt_tokens;
  state->max_new_tokens = request.max_new_tokens;
  state->speculative = request.speculative;
  waiting_.push_back(state.get());
  queued_tokens_ += request.num_prompt_tokens;
  requests_.emplace(request.id, std::move(state));
  return absl::OkStatus();
}

int64_t Scheduler::Growth(const RequestState& r, int64_t n) const {
  return std::max<int64_t>(0, r.num_computed + n - pool_->length(r.id));
}

void Scheduler::AddEntry(RequestState& r, int64_t n, int64_t drafts,
                         StepPlan& plan,
                         std::vector<RequestState*>& plan_reqs) {
  const absl::Status allocated = pool_->Allocate(r.id, Growth(r, n));
  CHECK(allocated.ok()) << allocated;  // Checked with CanAllocate.
  ScheduledSequence entry;
  entry.id = r.id;
  entry.start_position = r.num_computed;
  entry.num_tokens = n;
  entry.num_draft_tokens = drafts;
  const bool reaches_end =
      r.num_computed + n - drafts == r.num_prompt_tokens + r.num_generated;
  entry.output = reaches_end && r.num_generated < r.max_new_tokens
                     ? ChunkOutput::kSample
                     : ChunkOutput::kNone;
  r.plan_index = static_cast<int64_t>(plan.sequences.size());
  plan.sequences.push_back(entry);
  plan_reqs.push_back(&r);
  plan.num_tokens += n;
}

Scheduler::RequestState* Scheduler::PreemptLatest(
    StepPlan& plan, std::vector<RequestState*>& plan_reqs, int64_t& budget) {
  RequestState* victim = running_.back();
  running_.pop_back();
  if (victim->plan_index >= 0) {
    const size_t index = static_cast<size_t>(victim->plan_index);
    budget += plan.sequences[index].num_tokens;
    plan.num_tokens -= plan.sequences[index].num_tokens;
    plan.sequences.erase(plan.sequences.begin() + index);
    plan_reqs.erase(plan_reqs.begin() + index);
    for (size_t j = index; j < plan_reqs.size(); ++j) {
      plan_reqs[j]->plan_index = static_cast<int64_t>(j);
    }
    victim->plan_index = -1;
  }
  FreeBlocks(victim->id);
  victim->running = false;
  victim->num_computed = 0;
  ++victim->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(victim);
  queued_tokens_ += Pending(*victim);
  plan.preempted.push_back(victim->id);
  return victim;
}

absl::StatusOr<StepPlan> Scheduler::Schedule() {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", in_flight_.front().step_id, " is still in flight"));
  }
  StepPlan plan;
  std::vector<RequestState*> plan_reqs;
  int64_t budget = options_.max_num_batched_tokens;
  const int64_t threshold = options_.long_prefill_token_threshold > 0
                                ? options_.long_prefill_token_threshold
                                : budget;

  // Running requests: decodes, then partial prefills.
  for (const bool decodes : {true, false}) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      RequestState& r = *running_[i];
      if (r.plan_index >= 0 || IsDecode(r) != decodes) continue;
      int64_t n;
      int64_t drafts = 0;
      if (decodes) {
        // Drafts past max_new_tokens would be wasted.
        drafts = r.speculative
                     ? std::min(options_.num_speculative_tokens,
                                r.max_new_tokens - r.num_generated - 1)
                     : 0;
        n = std::min(1 + drafts, budget);
        drafts = n - 1;
      } else {
        n = std::min({Pending(r), threshold, budget});
      }
      bool preempted_self = false;
      while (!pool_->CanAllocate(r.id, Growth(r, n))) {
        if (PreemptLatest(plan, plan_reqs, budget) == &r) {
          preempted_self = true;
          break;
        }
      }
      // r was the last running request, so the pass is over.
      if (preempted_self) break;
      AddEntry(r, n, drafts, plan, plan_reqs);
      budget -= n;
    }
  }

  // Waiting requests, first come first served; none after a preemption, as
  // the pool just proved too small.
  while (plan.preempted.empty() && !waiting_.empty() && budget > 0 &&
         num_running() < options_.max_num_seqs) {
    RequestState& r = *waiting_.front();
    const int64_t n = std::min({Pending(r), threshold, budget});
    if (!pool_->CanAllocate(r.id, Growth(r, n))) break;
    waiting_.pop_front();
    queued_tokens_ -= Pending(r);
    r.running = true;
    running_.push_back(&r);
    AddEntry(r, n, /*drafts=*/0, plan, plan_reqs);
    budget -= n;
  }

  for (RequestState* r : plan_reqs) r->plan_index = -1;
  if (plan.sequences.empty()) return plan;
  plan.step_id = next_step_id_++;
  AddInFlight(plan, plan_reqs);
  return plan;
}

void Scheduler::AddInFlight(const StepPlan& plan,
                            const std::vector<RequestState*>& reqs) {
  InFlightStep& step = in_flight_.emplace_back();
  step.step_id = plan.step_id;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    step.seqs.push_back({plan.sequences[i], reqs[i]->arrival});
    step.index.emplace(plan.sequences[i].id, i);
  }
}

absl::StatusOr<StepPlan> Scheduler::ScheduleAhead() {
  if (in_flight_.size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        in_flight_.size(), " steps are in flight; ScheduleAhead needs one"));
  }
  StepPlan plan;
  const InFlightStep& current = in_flight_.front();
  if (options_.num_speculative_tokens > 0 || !waiting_.empty() ||
      current.seqs.size() != running_.size()) {
    return plan;
  }
  std::vector<RequestState*> reqs;
  for (const InFlight& f : current.seqs) {
    const ScheduledSequence& e = f.entry;
    auto it = requests_.find(e.id);
    if (it == requests_.end() || it->second->arrival != f.arrival ||
        e.output != ChunkOutput::kSample || e.num_tokens != 1 ||
        e.num_draft_tokens != 0 || !IsDecode(*it->second)) {
      return StepPlan();
    }
    RequestState& r = *it->second;
    // The token in flight ends it at max_new_tokens.
    if (r.num_generated + 1 >= r.max_new_tokens) continue;
    reqs.push_back(&r);
  }
  if (reqs.empty() ||
      static_cast<int64_t>(reqs.size()) > options_.max_num_batched_tokens) {
    return StepPlan();
  }
  // Every decode after the step in flight (one more computed token each)
  // must fit without preempting: the growths of all of them on every rank.
  for (int rank = 0; rank < pool_->dcp_size(); ++rank) {
    int64_t add = 0;
    for (const RequestState* r : reqs) {
      const int64_t length = pool_->length(r->id);
      add += pool_->BlocksFor(rank, length + Growth(*r, 2)) -
             pool_->BlocksFor(rank, length);
    }
    if (add > pool_->free_blocks(rank)) return StepPlan();
  }
  for (RequestState* r : reqs) {
    const absl::Status allocated = pool_->Allocate(r->id, Growth(*r, 2));
    CHECK(allocated.ok()) << allocated;
    ScheduledSequence entry;
    entry.id = r->id;
    entry.start_position = r->num_computed + 1;
    entry.num_tokens = 1;
    entry.output = ChunkOutput::kSample;
    entry.starts_with_pending_token = true;
    plan.sequences.push_back(entry);
    plan.num_tokens += 1;
  }
  plan.step_id = next_step_id_++;
  AddInFlight(plan, reqs);
  return plan;
}

absl::StatusOr<std::vector<FinishedRequest>> Scheduler::OnStepDone(
    const StepResult& result) {
  if (in_flight_.empty()) {
    return absl::FailedPreconditionError("no step is in flight");
  }
  const InFlightStep& step = in_flight_.front();
  const std::vector<InFlight>& in_flight_seqs = step.seqs;
  if (result.step_id != step.step_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "result of step ", result.step_id, ", expected step ", step.step_id));
  }
  // Validate everything before changing anything.
  std::vector<const SequenceResult*> by_entry(in_flight_seqs.size(), nullptr);
  for (const SequenceResult& res : result.sequences) {
    auto it = step.index.find(res.id);
    if (it == step.index.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", res.id, " is not in step ", result.step_id));
    }
    if (by_entry[it->second] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", res.id, " has two results"));
    }
    by_entry[it->second] = &res;
    const ScheduledSequence& e = in_flight_seqs[it->second].entry;
    if (e.output == ChunkOutput::kNone &&
        (res.num_new_tokens != 0 || res.stopped)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", res.id,
                       ": a chunk without sampling produces no tokens"));
    }
    if (e.output == ChunkOutput::kSample &&
        (res.num_new_tokens < 1 ||
         res.num_new_tokens > 1 + e.num_draft_tokens)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", res.id, ": ", res.num_new_tokens,
                       " new tokens, expected 1 to ", 1 + e.num_draft_tokens));
    }
  }
  std::vector<RequestState*> live(in_flight_seqs.size(), nullptr);
  for (size_t i = 0; i < in_flight_seqs.size(); ++i) {
    auto it = requests_.find(in_flight_seqs[i].entry.id);
    if (it == requests_.end() ||
        it->second->arrival != in_flight_seqs[i].arrival) {
      continue;  // Aborted since the plan.
    }
    if (by_entry[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no result for sequence ", in_flight_seqs[i].entry.id,
                       " of step ", result.step_id));
    }
    live[i] = it->second.get();
  }

  std::vector<FinishedRequest> finished;
  for (size_t i = 0; i < in_flight_seqs.size(); ++i) {
    RequestState* r = live[i];
    if (r == nullptr) continue;
    const ScheduledSequence& e = in_flight_seqs[i].entry;
    const SequenceResult& res = *by_entry[i];
    if (e.output == ChunkOutput::kSample) {
      // The sampled token is not computed yet; accepted drafts are.
      r->num_computed = e.start_position + e.num_tokens - e.num_draft_tokens +
                        res.num_new_tokens - 1;
      r->num_generated += res.num_new_tokens;
    } else {
      r->num_computed = e.start_position + e.num_tokens;
    }
    const bool length_done =
        r->num_generated >= r->max_new_tokens &&
        (r->num_generated > 0 || r->num_computed >= r->num_prompt_tokens);
    if (!res.stopped && !length_done) continue;
    finished.push_back(
        {r->id, res.stopped ? FinishReason::kStop : FinishReason::kLength,
         r->num_prompt_tokens, r->num_generated});
    RemoveRunning(*r);
  }
  in_flight_.pop_front();
  return finished;
}

void Scheduler::FreeBlocks(RequestId id) {
  // NotFound for a sequence holding no blocks is fine: there is nothing to
  // free.
  pool_->Free(id).IgnoreError();
}

void Scheduler::RemoveRunning(RequestState& r) {
  CHECK(r.running);
  FreeBlocks(r.id);
  running_.erase(std::find(running_.begin(), running_.end(), &r));
  const RequestId id = r.id;
  requests_.erase(id);  // Destroys r.
}

absl::Status Scheduler::Abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request ", id, " is neither waiting nor running"));
  }
  RequestState& r = *it->second;
  if (r.running) {
    RemoveRunning(r);
    return absl::OkStatus();
  }
  queued_tokens_ -= Pending(r);
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &r));
  requests_.erase(it);
  return absl::OkStatus();
}

std::vector<RequestId> Scheduler::RequeueRunning() {
  in_flight_.clear();
  std::vector<RequestId> ids;
  ids.reserve(running_.size());
  // Latest first to the front: the queue stays in arrival order (every
  // running request arrived before every waiting one).
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    RequestState& r = **it;
    FreeBlocks(r.id);
    r.running = false;
    r.plan_index = -1;
    r.num_computed = 0;
    ++r.num_preemptions;
    ++num_preemptions_;
    waiting_.push_front(&r);
    queued_tokens_ += Pending(r);
    ids.push_back(r.id);
  }
  running_.clear();
  std::reverse(ids.begin(), ids.end());
  return ids;
}

absl::StatusOr<RequestProgress> Scheduler::GetProgress(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("request ", id, " is neither waiting nor running"));
  }
  const RequestState& r = *it->second;
  RequestProgress p;
  p.phase = r.running ? RequestPhase::kRunning : RequestPhase::kWaiting;
  p.num_prompt_tokens = r.num_prompt_tokens;
  p.max_new_tokens = r.max_new_tokens;
  p.num_generated_tokens = r.num_generated;
  p.num_computed_tokens = r.num_computed;
  p.num_preemptions = r.num_preemptions;
  p.arrival = r.arrival;
  return p;
}

}  // namespace mneme::coordinator
