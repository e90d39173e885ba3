// The transport overhead of the engram store: the same lookups (a decode
// step's rows, a prefill chunk's rows) through the in-process client, the
// gRPC client to a server in the same process, and the same-node
// shared-memory client to a ShmEngramServer in the same process, on the same
// store, in the same run, each as the model calls it (LookupInto: the rows
// into the caller's buffer). The ratios to in-process are the overheads.
//
//   bazel run //tests/bench/engram_service:rpc_overhead_bench

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/inflight_gate.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/client/shm_engram_client.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/engram_service.h"
#include "engram_store/service/request_handler.h"
#include "engram_store/service/shm_server.h"
#include "engram_store/shm/shm_wire.h"
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
  std::unique_ptr<RequestHandler> shm_handler;
  std::unique_ptr<ShmEngramServer> shm_server;
  std::unique_ptr<ShmEngramClient> shm;
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
    f->shm_handler = std::make_unique<RequestHandler>(f->store.get(),
                                                      service_options.limits);
    ShmServerOptions shm_options;
    shm_options.socket_path =
        "/tmp/mneme_rpc_bench_" + std::to_string(getpid()) + ".sock";
    f->shm_server = *ShmEngramServer::Create(shm_options, f->shm_handler.get(),
                                             &f->gate, nullptr);
    ShmEngramClientOptions shm_client;
    shm_client.socket_path = shm_options.socket_path;
    f->shm = *ShmEngramClient::Create(shm_client);
    f->layer = f->store->checkpoint().tables()[0].layer;
    f->vocab = f->store->checkpoint().hasher().vocabulary().num_tokens();
    return f;
  }();
  return *f;
}

// state.range(0): tokens per lookup (1 = decode step, 512 = prefill chunk);
// state.range(1): 0 = in-process, 1 = gRPC, 2 = shared memory.
void BM_Lookup(benchmark::State& state) {
  Fixture& f = Get();
  EngramClient* clients[] = {f.in_process.get(), f.grpc.get(), f.shm.get()};
  EngramClient& client = *clients[state.range(1)];
  const int64_t tokens = state.range(0);
  // One request, the same for every transport: after the first call every
  // row is in the store's RAM cache, so what differs is the transport.
  std::mt19937_64 rng(1);
  v1::LookupRequest request;
  request.set_layer_id(f.layer);
  for (int64_t i = 0; i < tokens + 3; ++i) {
    request.add_token_ids(static_cast<int64_t>(rng() % f.vocab));
  }
  request.set_context_token_count(3);
  absl::StatusOr<v1::LookupResponse> first = client.Lookup(request);
  if (!first.ok()) {
    state.SkipWithError(first.status().ToString().c_str());
    return;
  }
  std::vector<uint8_t> rows(first->rows().size());
  int64_t count = 0;
  for (auto _ : state) {
    absl::StatusOr<int32_t> r =
        client.LookupInto(request, false, absl::MakeSpan(rows));
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    count += first->row_ids_size();
  }
  state.counters["rows_per_s"] = benchmark::Counter(
      static_cast<double>(count), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Lookup)
    ->ArgNames({"tokens", "transport"})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({512, 0})
    ->Args({512, 1})
    ->Args({512, 2})
    ->UseRealTime();

// The same lookup through the in-process client and through shared memory,
// alternating call by call in one loop (each timed on its own), so that the
// machine's drift between runs does not enter the ratio. Counters: the mean
// of each, in microseconds, and shm / in-process.
void BM_SharedMemoryVsInProcess(benchmark::State& state) {
  Fixture& f = Get();
  std::mt19937_64 rng(1);
  v1::LookupRequest request;
  request.set_layer_id(f.layer);
  for (int64_t i = 0; i < state.range(0) + 3; ++i) {
    request.add_token_ids(static_cast<int64_t>(rng() % f.vocab));
  }
  request.set_context_token_count(3);
  absl::StatusOr<v1::LookupResponse> first = f.in_process->Lookup(request);
  if (!first.ok()) {
    state.SkipWithError(first.status().ToString().c_str());
    return;
  }
  std::vector<uint8_t> rows(first->rows().size());
  absl::Duration in_process, shared;
  for (auto _ : state) {
    const absl::Time t0 = absl::Now();
    const bool a =
        f.in_process->LookupInto(request, false, absl::MakeSpan(rows)).ok();
    const absl::Time t1 = absl::Now();
    const bool b = f.shm->LookupInto(request, false, absl::MakeSpan(rows)).ok();
    const absl::Time t2 = absl::Now();
    if (!a || !b) {
      state.SkipWithError("a lookup failed");
      break;
    }
    in_process += t1 - t0;
    shared += t2 - t1;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["in_process_us"] = absl::ToDoubleMicroseconds(in_process) / n;
  state.counters["shm_us"] = absl::ToDoubleMicroseconds(shared) / n;
  state.counters["shm/in_process"] = absl::FDivDuration(shared, in_process);
}
BENCHMARK(BM_SharedMemoryVsInProcess)
    ->ArgName("tokens")
    ->Arg(1)
    ->Arg(512)
    ->UseRealTime();

// The shared-memory transport's floor: an empty message each way through
// the two mailboxes of a Control block (what a shared-memory lookup adds to
// the store's work besides the request's encoding and the rows crossing
// between the cores).
void BM_MailboxRoundTrip(benchmark::State& state) {
  auto control = std::make_unique<shm::Control>();
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets) != 0) {
    state.SkipWithError("socketpair failed");
    return;
  }
  const absl::Duration spin = absl::Milliseconds(1);
  const absl::Time deadline = absl::Now() + absl::Hours(1);
  // Answers every call; a call with seq 0 ends it.
  std::thread peer([&] {
    for (uint64_t seen = 0;; ++seen) {
      if (!shm::Await(sockets[1], control->calls_posted, seen,
                      control->store_blocked, spin, deadline)
               .ok() ||
          control->call.seq == 0) {
        return;
      }
      (void)shm::Post(sockets[1], control->reply, control->replies_posted,
                      control->client_blocked, shm::Reply{});
    }
  });
  uint64_t replies = 0;
  for (auto _ : state) {
    shm::Call call;
    call.seq = replies + 1;
    (void)shm::Post(sockets[0], control->call, control->calls_posted,
                    control->store_blocked, call);
    if (!shm::Await(sockets[0], control->replies_posted, replies,
                    control->client_blocked, spin, deadline)
             .ok()) {
      state.SkipWithError("no answer");
      break;
    }
    ++replies;
  }
  (void)shm::Post(sockets[0], control->call, control->calls_posted,
                  control->store_blocked, shm::Call{});
  peer.join();
  close(sockets[0]);
  close(sockets[1]);
}
BENCHMARK(BM_MailboxRoundTrip)->UseRealTime();

}  // namespace
}  // namespace mneme::engram
