#include "common/work_pool.h"

#include <utility>

#include "absl/status/status.h"

namespace mneme {

absl::StatusOr<std::unique_ptr<WorkPool>> WorkPool::Create(int threads,
                                                           int64_t max_queued) {
  if (threads < 1) {
    return absl::InvalidArgumentError("WorkPool: threads must be >= 1");
  }
  if (max_queued < 1) {
    return absl::InvalidArgumentError("WorkPool: max_queued must be >= 1");
  }
  std::unique_ptr<WorkPool> pool(new WorkPool(max_queued));
  for (int i = 0; i < threads; ++i) {
    pool->threads_.emplace_back([p = pool.get()] { p->Loop(); });
  }
  return pool;
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool WorkPool::TrySchedule(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(queue_.size()) >= max_queued_) return false;
  queue_.push_back(std::move(task));
  return true;
}

int64_t WorkPool::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void WorkPool::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // Stopping and drained.
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace mneme
