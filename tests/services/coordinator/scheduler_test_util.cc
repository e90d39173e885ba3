#include "tests/services/coordinator/scheduler_test_util.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mneme::coordinator::testing {

// A pool of `blocks` blocks of `block_size` tokens on one rank, no window,
// whose whole capacity is the context.
SchedulerOptions SmallOptions(int64_t blocks, int64_t block_size) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 64;
  o.max_context_tokens = blocks * block_size;
  o.max_queued_tokens = int64_t{1} << 30;
  o.kv_pool.bytes_per_token = 2;
  o.kv_pool.block_size_tokens = block_size;
  o.kv_pool.bytes_per_rank = blocks * block_size * 2;
  o.kv_pool.sliding_window_tokens = 0;
  return o;
}

std::unique_ptr<Scheduler> Make(const SchedulerOptions& o) {
  absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

Request Req(RequestId id, int64_t prompt, int64_t max_new) {
  Request r;
  r.id = id;
  r.num_prompt_tokens = prompt;
  r.max_new_tokens = max_new;
  return r;
}

// Every sampling chunk yields its token and accepts all drafts.
StepResult AllAccepted(const StepPlan& plan) {
  StepResult result;
  result.step_id = plan.step_id;
  for (const ScheduledSequence& s : plan.sequences) {
    SequenceResult r;
    r.id = s.id;
    r.num_new_tokens =
        s.output == ChunkOutput::kSample ? 1 + s.num_draft_tokens : 0;
    result.sequences.push_back(r);
  }
  return result;
}

std::string ToString(const StepPlan& plan) {
  std::string out =
      absl::StrCat("step ", plan.step_id, " tokens ", plan.num_tokens, ":");
  for (const ScheduledSequence& s : plan.sequences) {
    absl::StrAppend(&out, " ", s.id, "@", s.start_position, "+", s.num_tokens,
                    "d", s.num_draft_tokens,
                    s.output == ChunkOutput::kSample ? "S" : "",
                    s.starts_with_pending_token ? "P" : "");
  }
  absl::StrAppend(&out, " preempted");
  for (RequestId id : plan.preempted) absl::StrAppend(&out, " ", id);
  return out;
}

// A plan's entry for `id`, or null.
const ScheduledSequence* Find(const StepPlan& plan, RequestId id) {
  for (const ScheduledSequence& s : plan.sequences) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

StepPlan MustSchedule(Scheduler& s) {
  absl::StatusOr<StepPlan> plan = s.Schedule();
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : StepPlan();
}

std::vector<FinishedRequest> MustFinishStep(Scheduler& s,
                                            const StepResult& result) {
  absl::StatusOr<std::vector<FinishedRequest>> done = s.OnStepDone(result);
  EXPECT_TRUE(done.ok()) << done.status();
  return done.ok() ? *done : std::vector<FinishedRequest>();
}

// Runs steps (all drafts accepted, no stop tokens) until nothing is left.
Trace RunToEnd(Scheduler& s, int max_steps) {
  Trace trace;
  for (int i = 0; i < max_steps && s.num_running() + s.num_waiting() > 0; ++i) {
    StepPlan plan = MustSchedule(s);
    EXPECT_FALSE(plan.sequences.empty()) << "stuck";
    if (plan.sequences.empty()) break;
    EXPECT_LE(plan.num_tokens, s.options().max_num_batched_tokens);
    for (const FinishedRequest& f : MustFinishStep(s, AllAccepted(plan))) {
      trace.finished.push_back(f);
    }
    trace.plans.push_back(std::move(plan));
  }
  return trace;
}

}  // namespace mneme::coordinator::testing
