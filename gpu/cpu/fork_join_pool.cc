#include "gpu/cpu/fork_join_pool.h"

#include <algorithm>
#include <cstdint>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"

namespace mneme::gpu {
namespace {

// True on a thread while it runs tasks of some pool: nested loops run inline
// (a nested parallel Run would wait for itself).
thread_local bool in_pool_task = false;

}  // namespace

ForkJoinPool::ForkJoinPool(int threads) : threads_(threads) {
  CHECK_GE(threads, 1);
  workers_.reserve(threads - 1);
  for (int i = 0; i + 1 < threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ForkJoinPool::~ForkJoinPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& worker : workers_) worker.join();
}

void ForkJoinPool::RunTasks(absl::FunctionRef<void(int64_t)> fn,
                            int64_t tasks) {
  for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < tasks;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    fn(i);
  }
}

void ForkJoinPool::WorkerLoop() {
  in_pool_task = true;
  uint64_t seen = 0;
  for (;;) {
    const absl::FunctionRef<void(int64_t)>* fn = nullptr;
    int64_t tasks = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      tasks = tasks_;
    }
    RunTasks(*fn, tasks);
    absl::MutexLock lock(&mu_);
    if (++finished_ == static_cast<int>(workers_.size())) done_cv_.Signal();
  }
}

void ForkJoinPool::Run(int64_t tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (tasks <= 0) return;
  if (tasks == 1 || workers_.empty() || in_pool_task) {
    for (int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  absl::MutexLock run_lock(&run_mu_);
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    tasks_ = tasks;
    finished_ = 0;
    next_.store(0, std::memory_order_relaxed);
    ++generation_;
    work_cv_.SignalAll();
  }
  in_pool_task = true;
  RunTasks(fn, tasks);
  in_pool_task = false;
  // Every worker checks in, so none still holds `fn` when Run returns.
  absl::MutexLock lock(&mu_);
  while (finished_ < static_cast<int>(workers_.size())) done_cv_.Wait(&mu_);
  fn_ = nullptr;
}

void ForkJoinPool::ParallelFor(int64_t n, int64_t grain,
                               absl::FunctionRef<void(int64_t, int64_t)> fn) {
  CHECK_GE(grain, 1);
  if (n <= 0) return;
  const int64_t chunks =
      std::clamp<int64_t>(n / grain, 1, static_cast<int64_t>(threads_));
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
  Run(chunks, [&](int64_t i) {
    const int64_t begin = i * chunk;
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace mneme::gpu
