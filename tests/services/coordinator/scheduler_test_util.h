#ifndef MNEME_TESTS_SERVICES_COORDINATOR_SCHEDULER_TEST_UTIL_H_
#define MNEME_TESTS_SERVICES_COORDINATOR_SCHEDULER_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "services/coordinator/scheduler.h"

namespace mneme::coordinator::testing {

// A pool of `blocks` blocks of `block_size` tokens on one rank, no window,
// whose whole capacity is the context.
SchedulerOptions SmallOptions(int64_t blocks, int64_t block_size = 4);

// Scheduler::Create, failing the test (and returning null) on an error.
std::unique_ptr<Scheduler> Make(const SchedulerOptions& o);

Request Req(RequestId id, int64_t prompt, int64_t max_new);

// Every sampling chunk yields its token and accepts all drafts.
StepResult AllAccepted(const StepPlan& plan);

// One line per plan: "step N tokens T: id@start+numdD[S][P] ... preempted
// ..." (S: samples; P: starts with the pending token).
std::string ToString(const StepPlan& plan);

// A plan's entry for `id`, or null.
const ScheduledSequence* Find(const StepPlan& plan, RequestId id);

// Schedule / OnStepDone, failing the test on an error.
StepPlan MustSchedule(Scheduler& s);
std::vector<FinishedRequest> MustFinishStep(Scheduler& s,
                                            const StepResult& result);

struct Trace {
  std::vector<StepPlan> plans;
  std::vector<FinishedRequest> finished;
};

// Runs steps (all drafts accepted, no stop tokens) until nothing is left.
Trace RunToEnd(Scheduler& s, int max_steps = 10000);

}  // namespace mneme::coordinator::testing

#endif  // MNEME_TESTS_SERVICES_COORDINATOR_SCHEDULER_TEST_UTIL_H_
