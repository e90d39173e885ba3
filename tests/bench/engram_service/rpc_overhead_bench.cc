// The RPC overhead of the engram store service: the same lookups (a decode
// step's rows, a prefill chunk's rows) through the in-process client and
// through the gRPC client to a server in the same process, on the same
// store, in the same run. The ratio of the two is the overhead.
//
//   bazel run -c opt //tests/bench/engram_service:rpc_overhead_bench

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "common/inflight_gate.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/engram_service.h"
#include "services/common/server_runner.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram {
namespace {

struct Fixture {
  std::unique_ptr<EngramStore> store;
  InflightGate gate;
  std::unique_ptr<EngramService> service;
  std::unique_ptr<ServerRunner> runner;
  std::unique_ptr<GrpcEngramClient> grpc;
  std::unique_ptr<InProcessEngramClient> in_process;
  int layer = 0;
  int64_t vocab = 0;
};

Fixture& Get() {
  static Fixture* f = [] {
    auto* f = new Fixture();
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") +
                            "/mneme_rpc_bench_" + std::to_string(getpid());
    synthetic::SyntheticCheckpointOptions options;
    options.out_dir = dir;
    options.threads = 2;
    if (!synthetic::MakeSyntheticCheckpoint(options).ok()) std::abort();
    EngramStoreOptions store_options;
    store_options.checkpoint_dir = dir;
    store_options.io_threads = 4;
    f->store = *EngramStore::Create(store_options);
    EngramServiceOptions service_options;
    f->service = *EngramService::Create(service_options, f->store.get(),
                                        &f->gate, nullptr);
    f->runner =
        *ServerRunner::Create(ServerOptions(), {f->service.get()}, &f->gate);
    GrpcEngramClientOptions client_options;
    client_options.target = f->runner->address().ToString();
    f->grpc = *GrpcEngramClient::Create(client_options);
    f->in_process = std::make_unique<InProcessEngramClient>(
        f->store.get(), service_options.limits);
    f->layer = f->store->checkpoint().tables()[0].layer;
    f->vocab = f->store->checkpoint().hasher().vocabulary().num_tokens();
    return f;
  }();
  return *f;
}

// state.range(0): tokens per lookup (1 = decode step, 512 = prefill chunk);
// state.range(1): 0 = in-process, 1 = gRPC.
void BM_Lookup(benchmark::State& state) {
  Fixture& f = Get();
  EngramClient& client = state.range(1) == 0
                             ? static_cast<EngramClient&>(*f.in_process)
                             : static_cast<EngramClient&>(*f.grpc);
  std::mt19937_64 rng(1);
  int64_t rows = 0;
  for (auto _ : state) {
    v1::LookupRequest request;
    request.set_layer_id(f.layer);
    for (int64_t i = 0; i < state.range(0) + 3; ++i) {
      request.add_token_ids(static_cast<int64_t>(rng() % f.vocab));
    }
    request.set_context_token_count(3);
    absl::StatusOr<v1::LookupResponse> r = client.Lookup(request);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    rows += r->row_ids_size();
  }
  state.counters["rows_per_s"] = benchmark::Counter(
      static_cast<double>(rows), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Lookup)
    ->ArgNames({"tokens", "grpc"})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({512, 0})
    ->Args({512, 1})
    ->UseRealTime();

}  // namespace
}  // namespace mneme::engram
