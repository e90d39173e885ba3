#include "tools/quant/parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace mneme::quant {

int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

absl::Status ParallelFor(int threads, int64_t count,
                         const std::function<absl::Status(int64_t)>& fn) {
  if (count <= 0) return absl::OkStatus();
  const int workers =
      static_cast<int>(std::min<int64_t>(ResolveThreads(threads), count));
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  int64_t error_index = count;
  absl::Status error;
  auto run = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      absl::Status status = fn(i);
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        if (i < error_index) {
          error_index = i;
          error = std::move(status);
        }
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int t = 1; t < workers; ++t) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
  return error;
}

}  // namespace mneme::quant
