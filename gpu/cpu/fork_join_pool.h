#ifndef MNEME_GPU_CPU_FORK_JOIN_POOL_H_
#define MNEME_GPU_CPU_FORK_JOIN_POOL_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace mneme::gpu {

// A fixed set of threads that runs the parts of one data-parallel loop at a
// time, the calling thread taking part (fork-join): no thread is started per
// call and nothing is queued. The CPU backend splits its token / head / row
// loops with it.
//
// Thread-safety: Run and ParallelFor may be called from any thread; calls are
// serialised (one loop at a time). A call made from inside a task runs
// inline on that thread instead of nesting.
class ForkJoinPool {
 public:
  // `threads` >= 1 (CHECK): the caller plus threads - 1 workers, started
  // here and joined by the destructor.
  explicit ForkJoinPool(int threads);
  ~ForkJoinPool();

  ForkJoinPool(const ForkJoinPool&) = delete;
  ForkJoinPool& operator=(const ForkJoinPool&) = delete;

  // Threads that run tasks, the caller included.
  int threads() const { return threads_; }

  // Calls fn(i) once for each i in [0, tasks), on the workers and the
  // calling thread, and returns when every call has returned. Runs inline
  // when tasks <= 1, when there are no workers, or inside a task.
  void Run(int64_t tasks, absl::FunctionRef<void(int64_t)> fn);

  // Splits [0, n) into at most threads() contiguous chunks of at least
  // `grain` (>= 1) indices and calls fn(begin, end) for each through Run, so
  // small loops stay on the calling thread.
  void ParallelFor(int64_t n, int64_t grain,
                   absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  void WorkerLoop();
  // Claims and runs tasks of the current loop until none is left.
  void RunTasks(absl::FunctionRef<void(int64_t)> fn, int64_t tasks);

  const int threads_;
  // Held for the whole of a parallel Run: one loop at a time.
  absl::Mutex run_mu_;
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // generation_ or stop_ changed
  absl::CondVar done_cv_;  // finished_ reached the worker count
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The current loop; valid while its Run is in progress.
  const absl::FunctionRef<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers done with the current generation.
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  // Next unclaimed task of the current loop; reset under mu_ before the
  // generation changes, when no worker is inside RunTasks.
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CPU_FORK_JOIN_POOL_H_
