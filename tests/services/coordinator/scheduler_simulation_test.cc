// The scheduler under a randomized workload (its own file to keep
// scheduler_test.cc short).

#include <algorithm>
#include <cstdint>
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
#include "services/coordinator/scheduler.h"
#include "tests/services/coordinator/scheduler_test_util.h"

namespace mneme::coordinator {
namespace {

using ::mneme::coordinator::testing::Make;
using ::mneme::coordinator::testing::MustFinishStep;
using ::mneme::coordinator::testing::MustSchedule;
using ::mneme::coordinator::testing::Req;
using ::mneme::coordinator::testing::ToString;

// ---------------------------------------------------------------------------
// Randomized simulation

struct SimOutcome {
  std::vector<std::string> plans;
  std::map<RequestId, FinishedRequest> finished;
  int64_t preemptions = 0;
};

// 32 requests of mixed lengths arriving over time, a pool far too small
// for all of them, DCP 2 with interleave 2, a window, speculative decoding
// with random acceptance and occasional stop tokens. A model of the workers
// checks every plan against what they hold.
SimOutcome Simulate(uint64_t seed) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 64;
  o.long_prefill_token_threshold = 32;
  o.max_num_seqs = 8;
  o.num_speculative_tokens = 2;
  o.max_context_tokens = 448;
  o.max_queued_requests = 32;
  o.kv_pool.bytes_per_token = 1;
  o.kv_pool.block_size_tokens = 4;
  o.kv_pool.bytes_per_rank = int64_t{80} * 4;
  o.kv_pool.dcp_size = 2;
  o.kv_pool.dcp_interleave = 2;
  o.kv_pool.sliding_window_tokens = 8;
  std::unique_ptr<Scheduler> s = Make(o);
  SimOutcome out;
  if (s == nullptr) return out;

  std::mt19937_64 rng(seed);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::vector<Request> requests;
  for (RequestId id = 1; id <= 32; ++id) {
    const int64_t prompt =
        uniform(0, 9) < 7 ? uniform(1, 40) : uniform(100, 400);
    requests.push_back(Req(id, prompt, uniform(0, 48)));
  }
  struct Worker {
    int64_t computed = 0;
    int64_t generated = 0;
    bool stopped = false;
  };
  std::map<RequestId, Worker> workers;
  size_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    for (int64_t k = uniform(0, 3); k > 0 && next < requests.size(); --k) {
      EXPECT_TRUE(s->AddRequest(requests[next]).ok());
      workers[requests[next].id] = Worker();
      ++next;
    }
    if (next == requests.size() && s->num_running() + s->num_waiting() == 0) {
      break;
    }
    StepPlan plan = MustSchedule(*s);
    out.plans.push_back(ToString(plan));
    EXPECT_LE(plan.num_tokens, o.max_num_batched_tokens);
    EXPECT_LE(s->num_running(), o.max_num_seqs);
    for (RequestId id : plan.preempted) workers[id].computed = 0;
    if (plan.sequences.empty()) {
      EXPECT_EQ(s->num_running(), 0);
      continue;
    }
    StepResult result;
    result.step_id = plan.step_id;
    std::set<RequestId> seen;
    int64_t sum = 0;
    for (const ScheduledSequence& e : plan.sequences) {
      EXPECT_TRUE(seen.insert(e.id).second);
      sum += e.num_tokens;
      const Request& req = requests[e.id - 1];
      Worker& w = workers[e.id];
      EXPECT_EQ(e.start_position, w.computed) << "request " << e.id;
      EXPECT_GE(e.num_tokens, 1);
      EXPECT_LE(e.start_position + e.num_tokens - e.num_draft_tokens,
                req.num_prompt_tokens + w.generated);
      EXPECT_LE(e.start_position + e.num_tokens,
                req.num_prompt_tokens + req.max_new_tokens);
      SequenceResult r;
      r.id = e.id;
      if (e.output == ChunkOutput::kSample) {
        r.num_new_tokens = 1 + uniform(0, e.num_draft_tokens);
        // About one stop token in 100.
        for (int64_t j = 1; j <= r.num_new_tokens; ++j) {
          if (uniform(0, 99) == 0) {
            r.num_new_tokens = j;
            r.stopped = true;
            break;
          }
        }
        w.computed = e.start_position + e.num_tokens - e.num_draft_tokens +
                     r.num_new_tokens - 1;
        w.generated += r.num_new_tokens;
        w.stopped = r.stopped;
      } else {
        EXPECT_EQ(e.num_draft_tokens, 0);
        w.computed = e.start_position + e.num_tokens;
      }
      result.sequences.push_back(r);
    }
    EXPECT_EQ(sum, plan.num_tokens);
    // Results in reverse order: their order does not matter.
    std::reverse(result.sequences.begin(), result.sequences.end());
    for (const FinishedRequest& f : MustFinishStep(*s, result)) {
      EXPECT_TRUE(out.finished.emplace(f.id, f).second);
      workers[f.id].computed = 0;
    }
    for (int r = 0; r < o.kv_pool.dcp_size; ++r) {
      EXPECT_LE(s->kv_pool().used_blocks(r), s->kv_pool().blocks_per_rank());
    }
  }
  EXPECT_EQ(out.finished.size(), 32u);
  for (const Request& req : requests) {
    auto it = out.finished.find(req.id);
    if (it == out.finished.end()) continue;
    const Worker& w = workers[req.id];
    EXPECT_EQ(it->second.num_generated_tokens, w.generated);
    if (w.stopped) {
      EXPECT_EQ(it->second.reason, FinishReason::kStop);
      EXPECT_LE(w.generated, req.max_new_tokens);
    } else {
      EXPECT_EQ(it->second.reason, FinishReason::kLength);
      EXPECT_EQ(w.generated, req.max_new_tokens);
    }
  }
  EXPECT_EQ(s->num_running(), 0);
  EXPECT_EQ(s->num_waiting(), 0);
  EXPECT_EQ(s->num_queued_tokens(), 0);
  EXPECT_EQ(s->kv_pool().total_used_blocks(), 0);
  EXPECT_EQ(s->kv_pool().num_sequences(), 0);
  out.preemptions = s->num_preemptions();
  return out;
}

class SimulationTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(SimulationTest, EveryRequestFinishesAndThePoolEmpties) {
  SimOutcome a = Simulate(GetParam());
  // The pool is small enough to force preemptions.
  EXPECT_GT(a.preemptions, 0);
  int64_t stops = 0;
  for (const auto& [id, f] : a.finished)
    stops += f.reason == FinishReason::kStop;
  std::cout << "seed " << GetParam() << ": " << a.plans.size() << " steps, "
            << a.preemptions << " preemptions, " << stops << " stopped\n";
}

TEST_P(SimulationTest, SameInputsGiveSamePlans) {
  SimOutcome a = Simulate(GetParam());
  SimOutcome b = Simulate(GetParam());
  EXPECT_EQ(a.plans, b.plans);
  EXPECT_EQ(a.preemptions, b.preemptions);
  ASSERT_EQ(a.finished.size(), b.finished.size());
  for (const auto& [id, f] : a.finished) {
    EXPECT_EQ(f.num_generated_tokens, b.finished[id].num_generated_tokens);
    EXPECT_EQ(f.reason, b.finished[id].reason);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, SimulationTest,
                         ::testing::Values(1, 2, 3, 17, 2024));

}  // namespace
}  // namespace mneme::coordinator
