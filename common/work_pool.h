#ifndef MNEME_COMMON_WORK_POOL_H_
#define MNEME_COMMON_WORK_POOL_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mneme {

// A fixed set of threads running tasks from a bounded queue, so that gRPC
// reactors can hand off blocking work (disk reads, decoding) without ever
// blocking themselves and without a thread per request.
//
// Call order: Create() -> TrySchedule()* -> destructor (runs every task
// already queued, then joins). Thread-safe.
class WorkPool {
 public:
  // InvalidArgument when threads < 1 or max_queued < 1.
  static absl::StatusOr<std::unique_ptr<WorkPool>> Create(int threads,
                                                          int64_t max_queued);

  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;
  ~WorkPool();

  // Queues `task`; false (and `task` is dropped unrun) when max_queued tasks
  // are already waiting. Never blocks.
  bool TrySchedule(absl::AnyInvocable<void() &&> task);

  int64_t queued() const;

 private:
  explicit WorkPool(int64_t max_queued) : max_queued_(max_queued) {}
  void Loop();

  const int64_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace mneme

#endif  // MNEME_COMMON_WORK_POOL_H_
