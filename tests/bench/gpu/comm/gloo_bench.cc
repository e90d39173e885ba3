// All-reduce latency of GlooCommunicator over loopback TCP, ranks as
// threads of this process: 1 KiB .. 4 MiB per rank, 2 and 4 ranks. Each
// benchmark thread is one rank (Google Benchmark runs the same number of
// iterations on every thread, so the ranks stay in step).
//
//   bazel run -c opt //tests/bench/gpu/comm:gloo_bench
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "benchmark/benchmark.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/in_memory_rendezvous_store.h"

namespace mneme::gpu {
namespace {

// The communicators of one group size, created once and reused by every
// run of that size.
struct Group {
  std::unique_ptr<InMemoryRendezvousStore> store;
  std::vector<std::unique_ptr<GlooCommunicator>> comms;
};

Group& GroupOf(int size) {
  static std::mutex mu;
  static auto* groups = new std::map<int, Group>();
  std::lock_guard<std::mutex> lock(mu);
  Group& group = (*groups)[size];
  if (!group.comms.empty()) return group;
  group.store = *InMemoryRendezvousStore::Create({});
  group.comms.resize(size);
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&group, r, size] {
      GlooCommunicatorOptions options;
      options.rank = r;
      options.size = size;
      auto comm = GlooCommunicator::Create(options, *group.store);
      if (!comm.ok()) {
        std::fprintf(stderr, "GlooCommunicator::Create: %s\n",
                     comm.status().ToString().c_str());
        std::abort();
      }
      group.comms[r] = *std::move(comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return group;
}

void BM_GlooAllReduce(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int64_t count = bytes / sizeof(float);
  Communicator& comm = *GroupOf(state.threads()).comms[state.thread_index()];
  std::vector<float> data(count, 1.0f);
  for (auto _ : state) {
    if (absl::Status s = comm.AllReduceSum(data.data(), count); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(data.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_GlooAllReduce)
    ->RangeMultiplier(4)
    ->Range(1 << 10, 4 << 20)
    ->Threads(2)
    ->Threads(4)
    ->UseRealTime();

}  // namespace
}  // namespace mneme::gpu
