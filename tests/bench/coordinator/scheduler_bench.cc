// Scheduler time per step: one Schedule(), the step's results built, one
// OnStepDone(), with 16, 64 and 256 running sequences, to set against the
// step time of the workers:
//   - BM_Decode: every sequence decodes one token (DCP 1, no speculation).
//   - BM_DecodeDcp4Spec5: the reference topology (DCP 4, interleave 1,
//     window 128, 1 + 5 tokens per decode, all drafts accepted).
//   - BM_Churn: sequences of 2048 + 128 tokens finish and are replaced as
//     they go, so steps mix decodes, 512-token prefill chunks (long-prefill
//     threshold) and admissions.
// The pool is sized so that nothing is preempted.
//
//   bazel run //tests/bench/coordinator:scheduler_bench --
//       --benchmark_min_time=0.2
// (the default configuration already compiles with -O2, see .bazelrc)

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "benchmark/benchmark.h"
#include "services/coordinator/scheduler.h"

namespace mneme::coordinator {
namespace {

constexpr int64_t kContext = int64_t{1} << 30;

SchedulerOptions BenchOptions(int dcp_size, int64_t spec) {
  SchedulerOptions o;
  o.max_num_seqs = 256;
  o.num_speculative_tokens = spec;
  o.max_context_tokens = kContext;
  o.max_queued_tokens = kContext;
  o.kv_pool.bytes_per_token = 1;
  o.kv_pool.bytes_per_rank = int64_t{1} << 40;
  o.kv_pool.dcp_size = dcp_size;
  return o;
}

std::unique_ptr<Scheduler> MakeOrDie(const SchedulerOptions& o) {
  absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(o);
  if (!s.ok()) std::abort();
  return *std::move(s);
}

void Require(const absl::Status& status) {
  if (!status.ok()) std::abort();
}

StepResult AllAccepted(const StepPlan& plan) {
  StepResult result;
  result.step_id = plan.step_id;
  result.sequences.reserve(plan.sequences.size());
  for (const ScheduledSequence& s : plan.sequences) {
    result.sequences.push_back(
        {s.id, s.output == ChunkOutput::kSample ? 1 + s.num_draft_tokens : 0,
         false});
  }
  return result;
}

// One step; returns the number of requests that finished.
int64_t Step(Scheduler& s) {
  absl::StatusOr<StepPlan> plan = s.Schedule();
  if (!plan.ok() || plan->sequences.empty()) std::abort();
  absl::StatusOr<std::vector<FinishedRequest>> done =
      s.OnStepDone(AllAccepted(*plan));
  if (!done.ok()) std::abort();
  return static_cast<int64_t>(done->size());
}

// `n` sequences that never finish, stepped until all are decoding.
void RunDecode(benchmark::State& state, int dcp_size, int64_t spec) {
  const int64_t n = state.range(0);
  std::unique_ptr<Scheduler> s = MakeOrDie(BenchOptions(dcp_size, spec));
  for (int64_t id = 0; id < n; ++id) {
    Require(s->AddRequest({static_cast<RequestId>(id), 1024, kContext / 2}));
  }
  while (s->num_waiting() > 0) Step(*s);
  for (int i = 0; i < 4; ++i) Step(*s);  // The last prefills.
  for (auto _ : state) Step(*s);
  state.counters["seqs"] = static_cast<double>(s->num_running());
  state.counters["kv_blocks"] =
      static_cast<double>(s->kv_pool().total_used_blocks());
}

void BM_Decode(benchmark::State& state) { RunDecode(state, 1, 0); }
void BM_DecodeDcp4Spec5(benchmark::State& state) { RunDecode(state, 4, 5); }

void BM_Churn(benchmark::State& state) {
  const int64_t n = state.range(0);
  SchedulerOptions o = BenchOptions(1, 0);
  o.max_num_seqs = n;
  o.long_prefill_token_threshold = 512;
  std::unique_ptr<Scheduler> s = MakeOrDie(o);
  RequestId next = 0;
  // Staggered lengths, so that finishes spread over the steps.
  auto add = [&]() {
    Require(s->AddRequest({next, 2048, 128 + static_cast<int64_t>(next % 64)}));
    ++next;
  };
  for (int64_t i = 0; i < n; ++i) add();
  for (int i = 0; i < 300; ++i) {
    for (int64_t f = Step(*s); f > 0; --f) add();
  }
  int64_t finished = 0;
  for (auto _ : state) {
    const int64_t f = Step(*s);
    finished += f;
    for (int64_t i = 0; i < f; ++i) add();
  }
  state.counters["seqs"] = static_cast<double>(s->num_running());
  state.counters["finished_per_step"] =
      static_cast<double>(finished) / static_cast<double>(state.iterations());
}

BENCHMARK(BM_Decode)->Arg(16)->Arg(64)->Arg(256);
BENCHMARK(BM_DecodeDcp4Spec5)->Arg(16)->Arg(64)->Arg(256);
BENCHMARK(BM_Churn)->Arg(16)->Arg(64)->Arg(256);

}  // namespace
}  // namespace mneme::coordinator
