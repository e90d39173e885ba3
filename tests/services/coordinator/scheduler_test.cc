#include "services/coordinator/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/kv_block_pool.h"
#include "tests/services/coordinator/scheduler_test_util.h"

namespace mneme::coordinator {
namespace {

using ::mneme::coordinator::testing::AllAccepted;
using ::mneme::coordinator::testing::Find;
using ::mneme::coordinator::testing::Make;
using ::mneme::coordinator::testing::MustFinishStep;
using ::mneme::coordinator::testing::MustSchedule;
using ::mneme::coordinator::testing::Req;
using ::mneme::coordinator::testing::RunToEnd;
using ::mneme::coordinator::testing::SmallOptions;
using ::mneme::coordinator::testing::ToString;
using ::mneme::coordinator::testing::Trace;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Options

TEST(SchedulerTest, CreateRejectsInvalidOptionsNamingTheField) {
  struct Case {
    std::string field;
    void (*mutate)(SchedulerOptions&);
  };
  const Case cases[] = {
      {"max_num_batched_tokens",
       [](SchedulerOptions& o) { o.max_num_batched_tokens = 0; }},
      {"max_num_seqs", [](SchedulerOptions& o) { o.max_num_seqs = 0; }},
      {"long_prefill_token_threshold",
       [](SchedulerOptions& o) { o.long_prefill_token_threshold = -1; }},
      {"num_speculative_tokens",
       [](SchedulerOptions& o) { o.num_speculative_tokens = -1; }},
      {"num_speculative_tokens",
       [](SchedulerOptions& o) { o.num_speculative_tokens = 64; }},
      {"max_context_tokens",
       [](SchedulerOptions& o) { o.max_context_tokens = 0; }},
      {"max_queued_requests",
       [](SchedulerOptions& o) { o.max_queued_requests = 0; }},
      {"max_queued_tokens",
       [](SchedulerOptions& o) { o.max_queued_tokens = 0; }},
      {"max_queued_tokens",
       [](SchedulerOptions& o) { o.max_queued_tokens = 39; }},
      {"kv_pool.bytes_per_token",
       [](SchedulerOptions& o) { o.kv_pool.bytes_per_token = 0; }},
      {"kv_pool.dcp_size", [](SchedulerOptions& o) { o.kv_pool.dcp_size = 0; }},
      // The context no longer fits in the pool.
      {"max_context_tokens",
       [](SchedulerOptions& o) { o.max_context_tokens = 41; }},
      {"max_context_tokens",
       [](SchedulerOptions& o) { o.kv_pool.sliding_window_tokens = 4; }},
  };
  for (const Case& c : cases) {
    SchedulerOptions o = SmallOptions(10);
    ASSERT_TRUE(Scheduler::Create(o).ok());
    c.mutate(o);
    absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(o);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.status().message(), HasSubstr(c.field)) << c.field;
  }
}

TEST(SchedulerTest, DefaultsAreDocumented) {
  SchedulerOptions o;
  EXPECT_EQ(o.max_num_batched_tokens, 8192);
  EXPECT_EQ(o.max_num_seqs, 256);
  EXPECT_EQ(o.long_prefill_token_threshold, 0);
  EXPECT_EQ(o.num_speculative_tokens, 0);
  EXPECT_EQ(o.max_context_tokens, 524288);
  EXPECT_EQ(o.kv_pool.dcp_size, 1);
  EXPECT_EQ(o.kv_pool.dcp_interleave, 1);
  // The reference topology: 6 GiB per rank, DCP 4; ~1.9 KB per token per
  // rank holds a 500K context.
  o.kv_pool.bytes_per_token = 7540;
  o.kv_pool.dcp_size = 4;
  EXPECT_TRUE(Scheduler::Create(o).ok());
}

// ---------------------------------------------------------------------------
// Budget and chunked prefill

TEST(SchedulerTest, LongPromptIsChunkedByTheBudget) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_batched_tokens = 16;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 50, 2)).ok());
  Trace t = RunToEnd(*s);
  std::vector<std::string> plans;
  for (const StepPlan& p : t.plans) plans.push_back(ToString(p));
  EXPECT_THAT(plans, ElementsAre("step 1 tokens 16: 1@0+16d0 preempted",
                                 "step 2 tokens 16: 1@16+16d0 preempted",
                                 "step 3 tokens 16: 1@32+16d0 preempted",
                                 "step 4 tokens 2: 1@48+2d0S preempted",
                                 "step 5 tokens 1: 1@50+1d0S preempted"));
  ASSERT_EQ(t.finished.size(), 1u);
  EXPECT_EQ(t.finished[0].reason, FinishReason::kLength);
  EXPECT_EQ(t.finished[0].num_generated_tokens, 2);
}

TEST(SchedulerTest, LongPrefillThresholdCapsEachChunk) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_batched_tokens = 64;
  o.long_prefill_token_threshold = 10;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 25, 1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 25, 1)).ok());
  Trace t = RunToEnd(*s);
  std::vector<std::string> plans;
  for (const StepPlan& p : t.plans) plans.push_back(ToString(p));
  EXPECT_THAT(plans,
              ElementsAre("step 1 tokens 20: 1@0+10d0 2@0+10d0 preempted",
                          "step 2 tokens 20: 1@10+10d0 2@10+10d0 preempted",
                          "step 3 tokens 10: 1@20+5d0S 2@20+5d0S preempted"));
}

TEST(SchedulerTest, BudgetIsFilledAndNeverExceeded) {
  SchedulerOptions o = SmallOptions(1000);
  o.max_num_batched_tokens = 64;
  std::unique_ptr<Scheduler> s = Make(o);
  for (RequestId id = 1; id <= 20; ++id) {
    ASSERT_TRUE(s->AddRequest(Req(id, 30, 5)).ok());
  }
  StepPlan first = MustSchedule(*s);
  // Two whole prompts, then the rest of the budget as a chunk of the third.
  EXPECT_EQ(ToString(first),
            "step 1 tokens 64: 1@0+30d0S 2@0+30d0S 3@0+4d0 preempted");
  ASSERT_EQ(MustFinishStep(*s, AllAccepted(first)).size(), 0u);
  Trace t = RunToEnd(*s);
  EXPECT_EQ(t.finished.size(), 20u);
  for (const StepPlan& p : t.plans) {
    int64_t sum = 0;
    for (const ScheduledSequence& e : p.sequences) sum += e.num_tokens;
    EXPECT_EQ(sum, p.num_tokens);
    EXPECT_LE(p.num_tokens, 64);
  }
}

TEST(SchedulerTest, DecodesComeBeforePartialPrefills) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_batched_tokens = 8;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 2, 10)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 30, 1)).ok());
  StepPlan p1 = MustSchedule(*s);
  EXPECT_EQ(ToString(p1), "step 1 tokens 8: 1@0+2d0S 2@0+6d0 preempted");
  MustFinishStep(*s, AllAccepted(p1));
  // The decode first; the prefill gets what is left of the budget.
  StepPlan p2 = MustSchedule(*s);
  EXPECT_EQ(ToString(p2), "step 2 tokens 8: 1@2+1d0S 2@6+7d0 preempted");
}

TEST(SchedulerTest, LaterDecodePrecedesEarlierPartialPrefill) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_batched_tokens = 8;
  o.long_prefill_token_threshold = 6;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 20, 1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 2, 5)).ok());
  StepPlan p1 = MustSchedule(*s);
  EXPECT_EQ(ToString(p1), "step 1 tokens 8: 1@0+6d0 2@0+2d0S preempted");
  MustFinishStep(*s, AllAccepted(p1));
  StepPlan p2 = MustSchedule(*s);
  EXPECT_EQ(ToString(p2), "step 2 tokens 7: 2@2+1d0S 1@6+6d0 preempted");
}

// ---------------------------------------------------------------------------
// Admission

TEST(SchedulerTest, WaitingRequestsAreAdmittedFirstComeFirstServed) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_seqs = 2;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 4, 1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 4, 3)).ok());
  ASSERT_TRUE(s->AddRequest(Req(3, 4, 2)).ok());
  ASSERT_TRUE(s->AddRequest(Req(4, 4, 2)).ok());
  StepPlan p1 = MustSchedule(*s);
  EXPECT_EQ(ToString(p1), "step 1 tokens 8: 1@0+4d0S 2@0+4d0S preempted");
  EXPECT_EQ(s->num_running(), 2);
  EXPECT_EQ(s->num_waiting(), 2);
  std::vector<FinishedRequest> done = MustFinishStep(*s, AllAccepted(p1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1u);
  StepPlan p2 = MustSchedule(*s);
  EXPECT_EQ(ToString(p2), "step 2 tokens 5: 2@4+1d0S 3@0+4d0S preempted");
  EXPECT_EQ(s->GetProgress(4)->phase, RequestPhase::kWaiting);
}

TEST(SchedulerTest, AdmissionDoesNotSkipTheFrontOfTheQueue) {
  SchedulerOptions o = SmallOptions(10);  // 40 tokens.
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 24, 8)).ok());
  StepPlan p1 = MustSchedule(*s);
  MustFinishStep(*s, AllAccepted(p1));
  EXPECT_EQ(s->kv_pool().used_blocks(0), 6);
  // Request 2 needs 5 blocks, 3 are left after request 1's decode; request
  // 3 would fit but must not overtake it.
  ASSERT_TRUE(s->AddRequest(Req(2, 20, 1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(3, 4, 1)).ok());
  StepPlan p2 = MustSchedule(*s);
  EXPECT_EQ(ToString(p2), "step 2 tokens 1: 1@24+1d0S preempted");
  EXPECT_EQ(s->num_waiting(), 2);
  MustFinishStep(*s, AllAccepted(p2));
  Trace t = RunToEnd(*s);
  ASSERT_EQ(t.finished.size(), 3u);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

TEST(SchedulerTest, RunningSequencesNeverExceedTheLimit) {
  SchedulerOptions o = SmallOptions(1000);
  o.max_num_seqs = 3;
  std::unique_ptr<Scheduler> s = Make(o);
  for (RequestId id = 1; id <= 10; ++id) {
    ASSERT_TRUE(s->AddRequest(Req(id, 5, 1 + id % 4)).ok());
  }
  int64_t steps = 0;
  std::set<RequestId> finished;
  while (s->num_running() + s->num_waiting() > 0 && steps++ < 1000) {
    StepPlan p = MustSchedule(*s);
    EXPECT_LE(s->num_running(), 3);
    EXPECT_LE(p.sequences.size(), 3u);
    for (const FinishedRequest& f : MustFinishStep(*s, AllAccepted(p))) {
      EXPECT_EQ(f.num_generated_tokens, 1 + static_cast<int64_t>(f.id) % 4);
      finished.insert(f.id);
    }
  }
  EXPECT_EQ(finished.size(), 10u);
}

TEST(SchedulerTest, AdmissionLimitsGiveResourceExhausted) {
  SchedulerOptions o = SmallOptions(100);  // Context 400.
  o.max_queued_requests = 2;
  o.max_queued_tokens = 400;
  o.max_num_batched_tokens = 8;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 300, 1)).ok());
  // 300 + 101 > 400 tokens queued.
  EXPECT_EQ(s->AddRequest(Req(2, 101, 1)).code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s->AddRequest(Req(2, 100, 1)).ok());
  EXPECT_EQ(s->num_queued_tokens(), 400);
  // Two requests queued.
  EXPECT_EQ(s->AddRequest(Req(3, 1, 1)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s->num_waiting(), 2);
  // Admitting request 1 frees a place and its tokens.
  StepPlan p = MustSchedule(*s);
  EXPECT_EQ(s->num_waiting(), 1);
  EXPECT_EQ(s->num_queued_tokens(), 100);
  ASSERT_TRUE(s->AddRequest(Req(3, 300, 1)).ok());
  EXPECT_EQ(s->AddRequest(Req(4, 1, 1)).code(),
            absl::StatusCode::kResourceExhausted);
  MustFinishStep(*s, AllAccepted(p));
  Trace t = RunToEnd(*s);
  EXPECT_EQ(t.finished.size(), 3u);
}

TEST(SchedulerTest, InvalidRequestsChangeNothing) {
  SchedulerOptions o = SmallOptions(25);  // Context 100.
  o.max_num_batched_tokens = 16;
  std::unique_ptr<Scheduler> s = Make(o);
  std::unique_ptr<Scheduler> twin = Make(o);
  for (Scheduler* x : {s.get(), twin.get()}) {
    ASSERT_TRUE(x->AddRequest(Req(1, 20, 3)).ok());
    ASSERT_TRUE(x->AddRequest(Req(2, 20, 3)).ok());
    StepPlan p = MustSchedule(*x);
    MustFinishStep(*x, AllAccepted(p));
    ASSERT_TRUE(x->AddRequest(Req(3, 10, 3)).ok());
  }
  const int64_t running = s->num_running();
  const int64_t waiting = s->num_waiting();
  const int64_t queued = s->num_queued_tokens();
  const int64_t used = s->kv_pool().total_used_blocks();

  EXPECT_EQ(s->AddRequest(Req(9, 0, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(9, -4, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(9, 10, -1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(9, 90, 11)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(9, 101, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->AddRequest(Req(9, 10, int64_t{1} << 62)).code(),
            absl::StatusCode::kInvalidArgument);
  // Ids of a running and of a waiting request.
  EXPECT_EQ(s->AddRequest(Req(1, 10, 1)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->AddRequest(Req(3, 10, 1)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->GetProgress(9).status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(s->num_running(), running);
  EXPECT_EQ(s->num_waiting(), waiting);
  EXPECT_EQ(s->num_queued_tokens(), queued);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), used);
  EXPECT_EQ(s->GetProgress(3)->arrival, 2u);
  // The boundary is valid: prompt + max_new_tokens == context.
  ASSERT_TRUE(s->AddRequest(Req(4, 90, 10)).ok());
  ASSERT_TRUE(twin->AddRequest(Req(4, 90, 10)).ok());
  Trace a = RunToEnd(*s);
  Trace b = RunToEnd(*twin);
  ASSERT_EQ(a.plans.size(), b.plans.size());
  for (size_t i = 0; i < a.plans.size(); ++i) {
    EXPECT_EQ(ToString(a.plans[i]), ToString(b.plans[i]));
  }
}

// ---------------------------------------------------------------------------
// Step results

TEST(SchedulerTest, OnStepDoneValidatesAndChangesNothingOnError) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
  EXPECT_EQ(s->OnStepDone(StepResult()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Nothing to run is not a step.
  StepPlan empty = MustSchedule(*s);
  EXPECT_TRUE(empty.sequences.empty());
  EXPECT_FALSE(s->step_in_flight());

  ASSERT_TRUE(s->AddRequest(Req(1, 4, 5)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 100, 5)).ok());  // Chunk 60 of 100.
  StepPlan p = MustSchedule(*s);
  ASSERT_EQ(p.sequences.size(), 2u);
  EXPECT_TRUE(s->step_in_flight());
  EXPECT_EQ(s->Schedule().status().code(),
            absl::StatusCode::kFailedPrecondition);

  const StepResult good = AllAccepted(p);
  std::vector<StepResult> bad;
  StepResult r = good;
  r.step_id += 1;
  bad.push_back(r);
  r = good;
  r.sequences.push_back({7, 1, false});  // Not in the plan.
  bad.push_back(r);
  r = good;
  r.sequences.push_back(good.sequences[0]);  // Twice.
  bad.push_back(r);
  r = good;
  r.sequences.pop_back();  // Missing.
  bad.push_back(r);
  r = good;
  r.sequences[0].num_new_tokens = 0;  // A sampling chunk yields >= 1.
  bad.push_back(r);
  r = good;
  r.sequences[0].num_new_tokens = 2;  // No drafts: exactly 1.
  bad.push_back(r);
  r = good;
  r.sequences[1].num_new_tokens = 1;  // A middle chunk yields nothing.
  bad.push_back(r);
  r = good;
  r.sequences[1].stopped = true;
  bad.push_back(r);
  for (const StepResult& b : bad) {
    EXPECT_EQ(s->OnStepDone(b).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(s->step_in_flight());
    EXPECT_EQ(s->GetProgress(1)->num_generated_tokens, 0);
    EXPECT_EQ(s->GetProgress(1)->num_computed_tokens, 0);
  }
  ASSERT_TRUE(s->OnStepDone(good).ok());
  EXPECT_FALSE(s->step_in_flight());
  EXPECT_EQ(s->GetProgress(1)->num_generated_tokens, 1);
  EXPECT_EQ(s->GetProgress(1)->num_computed_tokens, 4);
  EXPECT_EQ(s->GetProgress(2)->num_computed_tokens, 60);
  EXPECT_EQ(s->OnStepDone(good).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SchedulerTest, StopTokenFinishesAndFreesBlocks) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
  ASSERT_TRUE(s->AddRequest(Req(1, 10, 50)).ok());
  StepPlan p = MustSchedule(*s);
  MustFinishStep(*s, AllAccepted(p));
  p = MustSchedule(*s);
  StepResult r = AllAccepted(p);
  r.sequences[0].stopped = true;
  std::vector<FinishedRequest> done = MustFinishStep(*s, r);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].reason, FinishReason::kStop);
  EXPECT_EQ(done[0].num_prompt_tokens, 10);
  EXPECT_EQ(done[0].num_generated_tokens, 2);
  EXPECT_EQ(s->num_running(), 0);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
  EXPECT_EQ(s->GetProgress(1).status().code(), absl::StatusCode::kNotFound);
}

TEST(SchedulerTest, ZeroMaxNewTokensPrefillsWithoutSampling) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_batched_tokens = 4;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 10, 0)).ok());
  Trace t = RunToEnd(*s);
  std::vector<std::string> plans;
  for (const StepPlan& p : t.plans) plans.push_back(ToString(p));
  EXPECT_THAT(plans, ElementsAre("step 1 tokens 4: 1@0+4d0 preempted",
                                 "step 2 tokens 4: 1@4+4d0 preempted",
                                 "step 3 tokens 2: 1@8+2d0 preempted"));
  ASSERT_EQ(t.finished.size(), 1u);
  EXPECT_EQ(t.finished[0].reason, FinishReason::kLength);
  EXPECT_EQ(t.finished[0].num_generated_tokens, 0);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

TEST(SchedulerTest, SpeculativeDecodesComputeOnePlusK) {
  SchedulerOptions o = SmallOptions(100);
  o.num_speculative_tokens = 3;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 4, 6)).ok());
  StepPlan p = MustSchedule(*s);
  EXPECT_EQ(ToString(p), "step 1 tokens 4: 1@0+4d0S preempted");
  MustFinishStep(*s, AllAccepted(p));
  p = MustSchedule(*s);
  EXPECT_EQ(ToString(p), "step 2 tokens 4: 1@4+4d3S preempted");
  EXPECT_EQ(s->kv_pool().length(1), 8);
  StepResult r = AllAccepted(p);
  r.sequences[0].num_new_tokens = 5;  // At most 1 + 3.
  EXPECT_EQ(s->OnStepDone(r).status().code(),
            absl::StatusCode::kInvalidArgument);
  r.sequences[0].num_new_tokens = 2;  // One draft accepted.
  MustFinishStep(*s, r);
  EXPECT_EQ(s->GetProgress(1)->num_generated_tokens, 3);
  EXPECT_EQ(s->GetProgress(1)->num_computed_tokens, 6);
  // Three tokens to go: two drafts at most.
  p = MustSchedule(*s);
  EXPECT_EQ(ToString(p), "step 3 tokens 3: 1@6+3d2S preempted");
  std::vector<FinishedRequest> done = MustFinishStep(*s, AllAccepted(p));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].num_generated_tokens, 6);
  EXPECT_EQ(done[0].reason, FinishReason::kLength);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

TEST(SchedulerTest, DraftsShrinkToTheRemainingBudget) {
  SchedulerOptions o = SmallOptions(100);
  o.num_speculative_tokens = 3;
  o.max_num_batched_tokens = 6;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 3, 20)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 3, 20)).ok());
  StepPlan p = MustSchedule(*s);
  MustFinishStep(*s, AllAccepted(p));
  p = MustSchedule(*s);
  EXPECT_EQ(ToString(p), "step 2 tokens 6: 1@3+4d3S 2@3+2d1S preempted");
}

// ---------------------------------------------------------------------------
// Preemption

TEST(SchedulerTest, FullPoolPreemptsTheLatestRequestWhichResumesLater) {
  SchedulerOptions o = SmallOptions(6);  // 24 tokens.
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 8, 12)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 8, 12)).ok());
  Trace t = RunToEnd(*s);

  std::vector<std::string> plans;
  for (const StepPlan& p : t.plans) plans.push_back(ToString(p));
  // Steps 2-5 decode both (lengths 9-12, 3 blocks each); in step 6 request
  // 1 needs a 4th block and request 2, the later one, gives up its 3.
  EXPECT_EQ(plans[4], "step 5 tokens 2: 1@11+1d0S 2@11+1d0S preempted");
  EXPECT_EQ(plans[5], "step 6 tokens 1: 1@12+1d0S preempted 2");
  // Request 2 waits until request 1 is done (5 blocks), then recomputes
  // its prompt and its 5 generated tokens from position 0.
  EXPECT_EQ(plans[11], "step 12 tokens 1: 1@18+1d0S preempted");
  EXPECT_EQ(plans[12], "step 13 tokens 13: 2@0+13d0S preempted");
  EXPECT_EQ(s->num_preemptions(), 1);

  int64_t resumed_tokens = 0;
  for (size_t i = 12; i < t.plans.size(); ++i) {
    const ScheduledSequence* e = Find(t.plans[i], 2);
    ASSERT_NE(e, nullptr);
    resumed_tokens += e->num_tokens;
  }
  // After the restart it computes its prompt and every generated token but
  // the last (which is never fed back).
  EXPECT_EQ(resumed_tokens, 8 + 12 - 1);
  ASSERT_EQ(t.finished.size(), 2u);
  EXPECT_EQ(t.finished[0].id, 1u);
  EXPECT_EQ(t.finished[1].id, 2u);
  EXPECT_EQ(t.finished[1].num_generated_tokens, 12);
  EXPECT_EQ(t.finished[1].reason, FinishReason::kLength);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

TEST(SchedulerTest, PreemptionTakesBackAnAlreadyScheduledLaterDecode) {
  SchedulerOptions o = SmallOptions(8);  // 32 tokens.
  o.max_num_batched_tokens = 8;
  o.long_prefill_token_threshold = 4;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 24, 1)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 4, 8)).ok());
  Trace t = RunToEnd(*s);
  std::vector<std::string> plans;
  for (const StepPlan& p : t.plans) plans.push_back(ToString(p));
  ASSERT_GE(plans.size(), 9u);
  EXPECT_EQ(plans[0], "step 1 tokens 8: 1@0+4d0 2@0+4d0S preempted");
  EXPECT_EQ(plans[4], "step 5 tokens 5: 2@7+1d0S 1@16+4d0 preempted");
  // Request 2's decode (planned first) needs a 3rd block and request 1's
  // last chunk a 6th: the pool holds 8, so request 2, which arrived later,
  // is taken back out of the plan and preempted.
  EXPECT_EQ(plans[5], "step 6 tokens 4: 1@20+4d0S preempted 2");
  EXPECT_EQ(plans[6], "step 7 tokens 4: 2@0+4d0 preempted");
  EXPECT_EQ(plans[7], "step 8 tokens 4: 2@4+4d0 preempted");
  EXPECT_EQ(plans[8], "step 9 tokens 1: 2@8+1d0S preempted");
  ASSERT_EQ(t.finished.size(), 2u);
  EXPECT_EQ(t.finished[1].id, 2u);
  EXPECT_EQ(t.finished[1].num_generated_tokens, 8);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

// ---------------------------------------------------------------------------
// Abort

TEST(SchedulerTest, AbortFreesWaitingAndRunningRequests) {
  SchedulerOptions o = SmallOptions(100);
  o.max_num_batched_tokens = 16;
  std::unique_ptr<Scheduler> s = Make(o);
  ASSERT_TRUE(s->AddRequest(Req(1, 40, 5)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 40, 5)).ok());
  StepPlan p = MustSchedule(*s);  // 1 mid-prefill, 2 waiting.
  MustFinishStep(*s, AllAccepted(p));
  EXPECT_GT(s->kv_usage(), 0.0);
  EXPECT_EQ(s->num_queued_tokens(), 40);

  ASSERT_TRUE(s->Abort(2).ok());
  EXPECT_EQ(s->num_waiting(), 0);
  EXPECT_EQ(s->num_queued_tokens(), 0);
  ASSERT_TRUE(s->Abort(1).ok());
  EXPECT_EQ(s->num_running(), 0);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
  EXPECT_EQ(s->kv_pool().num_sequences(), 0);
  EXPECT_DOUBLE_EQ(s->kv_usage(), 0.0);
  EXPECT_EQ(s->Abort(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s->Abort(99).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MustSchedule(*s).sequences.empty());
}

TEST(SchedulerTest, AbortDuringAStepIgnoresItsResult) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
  ASSERT_TRUE(s->AddRequest(Req(1, 8, 5)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 8, 5)).ok());
  ASSERT_TRUE(s->AddRequest(Req(3, 8, 5)).ok());
  StepPlan p = MustSchedule(*s);
  ASSERT_TRUE(s->Abort(1).ok());
  ASSERT_TRUE(s->Abort(2).ok());
  // A new request reuses id 2 while the step runs.
  ASSERT_TRUE(s->AddRequest(Req(2, 5, 1)).ok());
  // Results of aborted sequences may be given (ignored) or left out.
  StepResult r = AllAccepted(p);
  r.sequences.erase(r.sequences.begin());  // Drops request 1's.
  ASSERT_TRUE(s->OnStepDone(r).ok());
  EXPECT_EQ(s->GetProgress(2)->phase, RequestPhase::kWaiting);
  EXPECT_EQ(s->GetProgress(2)->num_generated_tokens, 0);
  EXPECT_EQ(s->GetProgress(3)->num_generated_tokens, 1);
  p = MustSchedule(*s);
  EXPECT_EQ(ToString(p), "step 2 tokens 6: 3@8+1d0S 2@0+5d0S preempted");
  MustFinishStep(*s, AllAccepted(p));
  ASSERT_TRUE(s->Abort(3).ok());
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

// ---------------------------------------------------------------------------
// Decode context parallelism

TEST(SchedulerTest, BlocksFollowDcpOwnershipOnEveryRank) {
  for (int n : {1, 2, 4}) {
    for (int interleave : {1, 3}) {
      SchedulerOptions o;
      o.max_num_batched_tokens = 32;
      o.max_context_tokens = 400;
      o.kv_pool.bytes_per_token = 1;
      o.kv_pool.block_size_tokens = 4;
      o.kv_pool.bytes_per_rank = int64_t{4} * 1000;
      o.kv_pool.dcp_size = n;
      o.kv_pool.dcp_interleave = interleave;
      o.kv_pool.sliding_window_tokens = 8;
      std::unique_ptr<Scheduler> s = Make(o);
      ASSERT_NE(s, nullptr);
      ASSERT_TRUE(s->AddRequest(Req(1, 70, 20)).ok());
      ASSERT_TRUE(s->AddRequest(Req(2, 13, 30)).ok());
      while (s->num_running() + s->num_waiting() > 0) {
        StepPlan p = MustSchedule(*s);
        const KvBlockPool& pool = s->kv_pool();
        std::vector<int64_t> expected(n, 0);
        for (RequestId id : {RequestId{1}, RequestId{2}}) {
          const ScheduledSequence* e = Find(p, id);
          if (e == nullptr) continue;
          ASSERT_EQ(pool.length(id), e->start_position + e->num_tokens);
          for (int r = 0; r < n; ++r) {
            const int64_t blocks = pool.BlocksFor(r, pool.length(id));
            EXPECT_EQ(pool.SequenceBlocks(id)[r], blocks);
            expected[r] += blocks;
          }
        }
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(pool.used_blocks(r), expected[r]) << "rank " << r;
        }
        MustFinishStep(*s, AllAccepted(p));
      }
      EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
    }
  }
}

// The workers lost every sequence mid-step: the step is dropped, the running
// requests are queued again in arrival order ahead of the waiting one and
// recompute their prompt plus what they generated, and every request still
// ends with its full length.
TEST(SchedulerTest, RequeueRunningRecomputesAfterALostGroup) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(64));
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->AddRequest(Req(1, 5, 4)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 3, 4)).ok());
  const StepPlan first = MustSchedule(*s);
  MustFinishStep(*s, AllAccepted(first));  // One token each.
  MustSchedule(*s);                        // In flight when the group is lost.
  ASSERT_TRUE(s->step_in_flight());
  ASSERT_TRUE(s->AddRequest(Req(3, 2, 2)).ok());  // Waiting.
  EXPECT_EQ(s->RequeueRunning(), std::vector<RequestId>({1, 2}));
  EXPECT_FALSE(s->step_in_flight());
  EXPECT_EQ(s->num_running(), 0);
  EXPECT_EQ(s->num_waiting(), 3);
  EXPECT_EQ(s->kv_usage(), 0.0);
  EXPECT_EQ(s->GetProgress(1)->num_preemptions, 1);
  // Recomputed from position 0: the prompt and the token generated.
  const StepPlan again = MustSchedule(*s);
  ASSERT_NE(Find(again, 1), nullptr);
  EXPECT_EQ(Find(again, 1)->start_position, 0);
  EXPECT_EQ(Find(again, 1)->num_tokens, 6);
  ASSERT_NE(Find(again, 2), nullptr);
  EXPECT_EQ(Find(again, 2)->num_tokens, 4);
  MustFinishStep(*s, AllAccepted(again));
  const Trace rest = RunToEnd(*s);
  int64_t generated = 0;
  for (const FinishedRequest& f : rest.finished) {
    generated += f.num_generated_tokens;
  }
  EXPECT_EQ(rest.finished.size(), 3u);
  EXPECT_EQ(generated, 4 + 4 + 2);
  // Nothing running: requeueing is a no-op.
  EXPECT_TRUE(s->RequeueRunning().empty());
}

// ---------------------------------------------------------------------------
// Overlap scheduling (ScheduleAhead)

// Plans ahead (when it can) after each Schedule, like the engine's loop, and
// returns the trace of plans; every request decodes to its length.
Trace RunAhead(Scheduler& s, int* ahead_plans) {
  Trace t;
  *ahead_plans = 0;
  std::deque<StepPlan> flight;
  for (int i = 0; i < 10000; ++i) {
    if (flight.empty()) {
      if (s.num_running() + s.num_waiting() == 0) break;
      flight.push_back(MustSchedule(s));
      t.plans.push_back(flight.back());
    }
    absl::StatusOr<StepPlan> ahead = s.ScheduleAhead();
    EXPECT_TRUE(ahead.ok()) << ahead.status();
    if (ahead.ok() && !ahead->sequences.empty()) {
      ++*ahead_plans;
      flight.push_back(*ahead);
      t.plans.push_back(*ahead);
    }
    std::vector<FinishedRequest> f = MustFinishStep(s, AllAccepted(flight[0]));
    t.finished.insert(t.finished.end(), f.begin(), f.end());
    flight.pop_front();
  }
  return t;
}

TEST(SchedulerTest, ScheduleAheadPlansTheNextDecodeOfEverySequence) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
  ASSERT_TRUE(s->AddRequest(Req(1, 6, 4)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 3, 2)).ok());
  // Nothing in flight: nothing to plan ahead of.
  EXPECT_EQ(s->ScheduleAhead().status().code(),
            absl::StatusCode::kFailedPrecondition);
  StepPlan p = MustSchedule(*s);  // The prompts: not a steady state.
  EXPECT_TRUE(s->ScheduleAhead()->sequences.empty());
  MustFinishStep(*s, AllAccepted(p));
  p = MustSchedule(*s);
  EXPECT_EQ(ToString(p), "step 2 tokens 2: 1@6+1d0S 2@3+1d0S preempted");
  // Request 2's token in flight is its last: only request 1 goes on.
  StepPlan ahead = *s->ScheduleAhead();
  EXPECT_EQ(ToString(ahead), "step 3 tokens 1: 1@7+1d0SP preempted");
  EXPECT_EQ(s->num_steps_in_flight(), 2);
  EXPECT_EQ(s->kv_pool().length(1), 8);
  EXPECT_EQ(s->ScheduleAhead().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Schedule().status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Results come in plan order.
  StepResult wrong = AllAccepted(ahead);
  EXPECT_EQ(s->OnStepDone(wrong).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<FinishedRequest> done = MustFinishStep(*s, AllAccepted(p));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 2u);
  EXPECT_EQ(done[0].reason, FinishReason::kLength);
  EXPECT_TRUE(MustFinishStep(*s, AllAccepted(ahead)).empty());
  EXPECT_EQ(s->GetProgress(1)->num_generated_tokens, 3);
  EXPECT_EQ(s->GetProgress(1)->num_computed_tokens, 8);
  EXPECT_FALSE(s->step_in_flight());
}

// Planning ahead changes no plan's contents: the same decodes, with the
// same positions, as planning each step after the previous one's results.
TEST(SchedulerTest, ScheduleAheadPlansWhatScheduleWould) {
  std::unique_ptr<Scheduler> a = Make(SmallOptions(200));
  std::unique_ptr<Scheduler> b = Make(SmallOptions(200));
  for (Scheduler* s : {a.get(), b.get()}) {
    ASSERT_TRUE(s->AddRequest(Req(1, 7, 9)).ok());
    ASSERT_TRUE(s->AddRequest(Req(2, 2, 5)).ok());
    ASSERT_TRUE(s->AddRequest(Req(3, 4, 12)).ok());
  }
  int ahead = 0;
  const Trace with = RunAhead(*a, &ahead);
  const Trace without = RunToEnd(*b);
  EXPECT_GT(ahead, 5);
  ASSERT_EQ(with.plans.size(), without.plans.size());
  for (size_t i = 0; i < with.plans.size(); ++i) {
    std::string w = ToString(with.plans[i]);
    w.erase(std::remove(w.begin(), w.end(), 'P'), w.end());
    EXPECT_EQ(w, ToString(without.plans[i])) << "step " << i;
  }
  ASSERT_EQ(with.finished.size(), 3u);
  EXPECT_EQ(a->kv_pool().total_used_blocks(), 0);
}

TEST(SchedulerTest, ScheduleAheadOnlyInTheSteadyState) {
  {
    // A request waits: it must be admitted by Schedule() first.
    std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
    ASSERT_TRUE(s->AddRequest(Req(1, 4, 8)).ok());
    MustFinishStep(*s, AllAccepted(MustSchedule(*s)));
    MustSchedule(*s);
    ASSERT_TRUE(s->AddRequest(Req(2, 4, 8)).ok());
    EXPECT_TRUE(s->ScheduleAhead()->sequences.empty());
    EXPECT_EQ(s->num_steps_in_flight(), 1);
  }
  {
    // Drafts: how many are accepted is not known ahead.
    SchedulerOptions o = SmallOptions(100);
    o.num_speculative_tokens = 2;
    std::unique_ptr<Scheduler> s = Make(o);
    ASSERT_TRUE(s->AddRequest(Req(1, 4, 8)).ok());
    MustFinishStep(*s, AllAccepted(MustSchedule(*s)));
    MustSchedule(*s);
    EXPECT_TRUE(s->ScheduleAhead()->sequences.empty());
  }
  // The pool holds the tokens in flight but not the next ones: no
  // preemption ahead of the results. 4-token blocks; after step 2 request 1
  // (3 + 1 tokens) and request 2 (7 + 1) hold 3 blocks, and their next
  // tokens need one more block each.
  for (const int64_t blocks : {3, 4}) {
    std::unique_ptr<Scheduler> s = Make(SmallOptions(blocks));
    ASSERT_TRUE(s->AddRequest(Req(1, 3, 4)).ok());
    ASSERT_TRUE(s->AddRequest(Req(2, 7, 4)).ok());
    MustFinishStep(*s, AllAccepted(MustSchedule(*s)));
    StepPlan p = MustSchedule(*s);
    EXPECT_EQ(ToString(p), "step 2 tokens 2: 1@3+1d0S 2@7+1d0S preempted");
    EXPECT_EQ(s->kv_pool().free_blocks(0), blocks - 3);
    // With one free block each would fit alone, but not both.
    EXPECT_TRUE(s->ScheduleAhead()->sequences.empty()) << blocks;
    EXPECT_EQ(s->kv_pool().free_blocks(0), blocks - 3);
  }
}

// A request that stops in the step in flight: its decode planned ahead is
// computed in vain and its result ignored; it finishes once.
TEST(SchedulerTest, StopInTheStepInFlightIgnoresTheAheadResult) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
  ASSERT_TRUE(s->AddRequest(Req(1, 4, 8)).ok());
  ASSERT_TRUE(s->AddRequest(Req(2, 4, 8)).ok());
  MustFinishStep(*s, AllAccepted(MustSchedule(*s)));
  const StepPlan p = MustSchedule(*s);
  const StepPlan ahead = *s->ScheduleAhead();
  ASSERT_EQ(ahead.sequences.size(), 2u);
  StepResult r = AllAccepted(p);
  r.sequences[0].stopped = true;
  std::vector<FinishedRequest> done = MustFinishStep(*s, r);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, 1u);
  EXPECT_EQ(done[0].num_generated_tokens, 2);
  EXPECT_TRUE(MustFinishStep(*s, AllAccepted(ahead)).empty());
  EXPECT_EQ(s->GetProgress(2)->num_generated_tokens, 3);
  EXPECT_EQ(s->GetProgress(1).status().code(), absl::StatusCode::kNotFound);
  // Aborted with two steps in flight: both results are ignored.
  const StepPlan next = MustSchedule(*s);
  const StepPlan next_ahead = *s->ScheduleAhead();
  ASSERT_TRUE(s->Abort(2).ok());
  EXPECT_TRUE(MustFinishStep(*s, AllAccepted(next)).empty());
  EXPECT_TRUE(MustFinishStep(*s, AllAccepted(next_ahead)).empty());
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
}

TEST(SchedulerTest, RequeueRunningDropsBothStepsInFlight) {
  std::unique_ptr<Scheduler> s = Make(SmallOptions(100));
  ASSERT_TRUE(s->AddRequest(Req(1, 4, 8)).ok());
  MustFinishStep(*s, AllAccepted(MustSchedule(*s)));
  MustSchedule(*s);
  ASSERT_FALSE(s->ScheduleAhead()->sequences.empty());
  EXPECT_EQ(s->RequeueRunning(), std::vector<RequestId>({1}));
  EXPECT_FALSE(s->step_in_flight());
  // Recomputed: the prompt and the one token whose result came.
  const StepPlan again = MustSchedule(*s);
  EXPECT_EQ(ToString(again), "step 4 tokens 5: 1@0+5d0S preempted");
}

}  // namespace
}  // namespace mneme::coordinator
