// Throughput of the worker's forward pass (services/worker/model) on the CPU
// backend: prefill and decode tokens per second at tensor-parallel sizes 1, 2
// and 4, and the share of step time spent in collectives and waiting for
// Engram rows.
//
// The ranks of a group are threads of this process, each with its own
// CpuBackend and Model over its own GlooCommunicator (TCP on 127.0.0.1); the
// communicators meet through one InMemoryRendezvousStore. All ranks share one
// EngramStore (RAM cache, warm after the first step) through one
// InProcessEngramClient. Every rank runs the same loop of steps with the same
// inputs and no barrier: the collectives inside Step() keep the ranks in step.
// The model is the tiny V4.1-Flash one (synthetic::MakeReleaseCheckpoint),
// written to a temporary directory at start and removed at the end.
//
//   bazel build //tests/bench/worker:forward_bench
//   bazel-bin/tests/bench/worker/forward_bench [--configs=1x1,1x2,2x1,4x1]
//       [--prefill_lengths=256,1024] [--prefill_steps=3]
//       [--decode_batches=1,8] [--decode_context=64] [--decode_steps=16]
//       [--warmup_steps=1] [--json_out=PATH] [--checkpoint=DIR]
//
// A config "TxN" is TP size T with N CpuBackend threads per rank (so "4x1"
// runs 4 threads in all). Scenarios, each run on every config:
//  - prefill L: one new sequence of L tokens in one step (last logits), then
//    released; tokens/s = L / step time.
//  - decode B: B sequences prefilled with --decode_context tokens each (one
//    untimed step), then steps of one token per sequence (last logits);
//    tokens/s = B / step time.
// Step time is each step's wall time averaged over the ranks, median over the
// timed steps (after --warmup_steps untimed ones). "comm" is the
// communicator's CommStats.time over the step's wall time and "engram"
// ModelStats.engram_time over it, each summed over the timed steps of a rank
// and averaged over the ranks. The Engram time includes the all-gather of
// the rows across ranks, so the two shares overlap by that collective; and
// collective time is wall time inside the call, so it includes waiting for a
// slower peer (ranks compete for the same cores here).
//
// Yardstick (TP > 1): before the scenarios every rank times bare all-reduces
// of one decode token's activation (hidden floats) and of a 256-token
// prefill's on the same communicators; their medians are printed per config.
//
// Prints a table, then the same results as one JSON document (also written
// to --json_out when given). As a sanity check it prints, per config, how far
// every rank's logits of the first step are from those of the first config.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "gpu/comm/in_memory_rendezvous_store.h"
#include "gpu/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "tests/bench/worker/forward_bench_util.h"
#include "tools/synthetic/release_checkpoint.h"

ABSL_FLAG(std::string, configs, "1x1,1x2,2x1,4x1",
          "Comma-separated TxN: TP size T with N CPU backend threads per rank");
ABSL_FLAG(std::string, prefill_lengths, "256,1024",
          "Comma-separated prompt lengths of the prefill scenarios");
ABSL_FLAG(int, prefill_steps, 3, "Timed steps per prefill scenario");
ABSL_FLAG(std::string, decode_batches, "1,8",
          "Comma-separated sequence counts of the decode scenarios");
ABSL_FLAG(int, decode_context, 64,
          "Tokens prefilled per sequence before decoding");
ABSL_FLAG(int, decode_steps, 16, "Timed steps per decode scenario");
ABSL_FLAG(int, warmup_steps, 1, "Untimed steps before each scenario's timed");
ABSL_FLAG(std::string, json_out, "", "Also write the JSON results here");
ABSL_FLAG(std::string, checkpoint, "",
          "Model checkpoint to use instead of a fresh tiny synthetic one");

namespace mneme::forward_bench {
namespace {

int Main() {
  absl::StatusOr<std::vector<Config>> configs =
      ParseConfigs(absl::GetFlag(FLAGS_configs));
  absl::StatusOr<std::vector<int>> lengths =
      ParseInts("prefill_lengths", absl::GetFlag(FLAGS_prefill_lengths));
  absl::StatusOr<std::vector<int>> batches =
      ParseInts("decode_batches", absl::GetFlag(FLAGS_decode_batches));
  for (const absl::Status& st :
       {configs.status(), lengths.status(), batches.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 2;
    }
  }
  Shared shared;
  shared.warmup_steps = std::max(0, absl::GetFlag(FLAGS_warmup_steps));
  shared.prefill_steps = std::max(1, absl::GetFlag(FLAGS_prefill_steps));
  shared.decode_steps = std::max(1, absl::GetFlag(FLAGS_decode_steps));
  shared.decode_context = std::max(1, absl::GetFlag(FLAGS_decode_context));
  for (int l : *lengths) {
    shared.scenarios.push_back(
        {Scenario::Kind::kPrefill, l, absl::StrCat("prefill ", l)});
  }
  for (int b : *batches) {
    shared.scenarios.push_back(
        {Scenario::Kind::kDecode, b, absl::StrCat("decode b", b)});
  }

  const Clock::time_point start = Clock::now();
  std::unique_ptr<TempDir> tmp;
  shared.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint);
  if (shared.checkpoint_dir.empty()) {
    absl::StatusOr<std::unique_ptr<TempDir>> t = TempDir::Create();
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 1;
    }
    tmp = *std::move(t);
    synthetic::ReleaseCheckpointOptions so;
    so.out_dir = tmp->path() + "/ckpt";
    if (absl::Status st = synthetic::MakeReleaseCheckpoint(so); !st.ok()) {
      std::fprintf(stderr, "making the checkpoint: %s\n",
                   st.ToString().c_str());
      return 1;
    }
    shared.checkpoint_dir = so.out_dir;
  }

  // One store and client for every rank of every config (the tables are
  // small: after the first steps every row comes from the RAM cache).
  engram::EngramStoreOptions eo;
  eo.checkpoint_dir = shared.checkpoint_dir;
  eo.ram_cache_bytes = uint64_t{64} << 20;
  eo.io_threads = 2;
  absl::StatusOr<std::unique_ptr<engram::EngramStore>> store =
      engram::EngramStore::Create(eo);
  if (!store.ok()) {
    std::fprintf(stderr, "engram store: %s\n",
                 store.status().ToString().c_str());
    return 1;
  }
  engram::InProcessEngramClient client(store->get(), engram::RequestLimits{});
  shared.engram = &client;

  std::printf("worker forward pass, CPU backend (%s), %u hardware threads\n",
              gpu::CpuBackend::SimdTargetName(),
              std::thread::hardware_concurrency());
  std::vector<Row> rows;
  std::vector<std::vector<RankResult>> all_ranks;
  nlohmann::json json_configs = nlohmann::json::array();
  int failures = 0;
  for (const Config& config : *configs) {
    absl::StatusOr<std::unique_ptr<gpu::InMemoryRendezvousStore>> rendezvous =
        gpu::InMemoryRendezvousStore::Create({});
    if (!rendezvous.ok()) {
      std::fprintf(stderr, "%s\n", rendezvous.status().ToString().c_str());
      return 1;
    }
    std::vector<RankResult> ranks(config.tp);
    const Clock::time_point t0 = Clock::now();
    std::vector<std::thread> threads;
    threads.reserve(config.tp);
    for (int r = 0; r < config.tp; ++r) {
      threads.emplace_back(
          [&, r] { RunRank(config, r, shared, rendezvous->get(), ranks[r]); });
    }
    for (std::thread& t : threads) t.join();
    const double seconds =
        std::chrono::duration<double>(Clock::now() - t0).count();
    bool ok = true;
    for (int r = 0; r < config.tp; ++r) {
      if (!ranks[r].status.ok()) {
        std::fprintf(stderr, "%s rank %d: %s\n", config.name.c_str(), r,
                     ranks[r].status.ToString().c_str());
        ok = false;
      }
    }
    if (!ok) {
      ++failures;
      continue;
    }
    std::printf("%s: ran in %.1f s (load %.2f s, %.1f MB of weights per rank)",
                config.name.c_str(), seconds, ranks[0].load_s,
                static_cast<double>(ranks[0].weight_bytes) / 1e6);
    nlohmann::json jc = {{"config", config.name},
                         {"tp", config.tp},
                         {"threads_per_rank", config.threads},
                         {"seconds", seconds},
                         {"load_s", ranks[0].load_s},
                         {"weight_bytes_per_rank", ranks[0].weight_bytes}};
    if (!ranks[0].allreduce_s.empty()) {
      nlohmann::json probes = nlohmann::json::array();
      std::printf("; all-reduce yardstick (median):");
      for (size_t p = 0; p < ranks[0].allreduce_s.size(); ++p) {
        double sum = 0;
        for (const RankResult& r : ranks) sum += r.allreduce_s[p];
        const double us = sum / static_cast<double>(ranks.size()) * 1e6;
        const int64_t kib = kProbeTokens[p] * ranks[0].hidden * 4 / 1024;
        std::printf(" %lld KiB %.0f us", static_cast<long long>(kib), us);
        probes.push_back({{"kib", kib}, {"median_us", us}});
      }
      jc["allreduce_yardstick"] = probes;
    }
    if (!all_ranks.empty()) {
      double diff = 0;
      for (const RankResult& r : ranks) {
        diff = std::max(
            diff, RelativeDiff(r.first_logits, all_ranks[0][0].first_logits));
      }
      std::printf("; first logits vs %s: max rel. diff %.2e",
                  (*configs)[0].name.c_str(), diff);
      jc["first_logits_rel_diff"] = diff;
    }
    std::printf("\n");
    std::fflush(stdout);
    json_configs.push_back(jc);
    for (size_t s = 0; s < shared.scenarios.size(); ++s) {
      rows.push_back(Summarize(config, shared.scenarios[s], s, ranks));
    }
    all_ranks.push_back(std::move(ranks));
  }
  // Throughput relative to the first config of the same scenario.
  for (Row& row : rows) {
    for (const Row& first : rows) {
      if (first.scenario == row.scenario) {
        row.vs_first =
            first.tokens_per_s > 0 ? row.tokens_per_s / first.tokens_per_s : 0;
        break;
      }
    }
  }

  std::printf(
      "\n| config | scenario | tok/step | step ms (median) | step ms (min) | "
      "tokens/s | vs %s | comm | engram | collectives/step | comm KiB/step |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n",
      rows.empty() ? "first" : rows[0].config.c_str());
  nlohmann::json json_rows = nlohmann::json::array();
  for (const Row& r : rows) {
    std::printf(
        "| %s | %s | %d | %.2f | %.2f | %.0f | %.2f | %.1f%% | %.1f%% | %.0f "
        "| %.0f |\n",
        r.config.c_str(), r.scenario.c_str(), r.tokens_per_step,
        r.step_ms_median, r.step_ms_min, r.tokens_per_s, r.vs_first,
        100 * r.comm_share, 100 * r.engram_share, r.collectives_per_step,
        r.comm_kib_per_step);
    json_rows.push_back({{"config", r.config},
                         {"tp", r.tp},
                         {"threads_per_rank", r.threads},
                         {"scenario", r.scenario},
                         {"tokens_per_step", r.tokens_per_step},
                         {"steps", r.steps},
                         {"step_ms_median", r.step_ms_median},
                         {"step_ms_min", r.step_ms_min},
                         {"tokens_per_s", r.tokens_per_s},
                         {"vs_first", r.vs_first},
                         {"comm_share", r.comm_share},
                         {"engram_share", r.engram_share},
                         {"collectives_per_step", r.collectives_per_step},
                         {"comm_kib_per_step", r.comm_kib_per_step}});
  }
  const double total_s =
      std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json json = {
      {"benchmark", "worker_forward_cpu"},
      {"simd_target", gpu::CpuBackend::SimdTargetName()},
      {"hardware_threads", std::thread::hardware_concurrency()},
      {"warmup_steps", shared.warmup_steps},
      {"prefill_steps", shared.prefill_steps},
      {"decode_steps", shared.decode_steps},
      {"decode_context", shared.decode_context},
      {"total_s", total_s},
      {"configs", json_configs},
      {"results", json_rows}};
  std::printf("\ntotal %.1f s\n%s\n", total_s, json.dump(2).c_str());
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << json.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "writing %s failed\n", json_out.c_str());
      return 1;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace mneme::forward_bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Throughput of the worker's CPU forward pass at TP 1, 2 and 4 (ranks as "
      "threads over Gloo on 127.0.0.1) and the share of step time in "
      "collectives.");
  absl::ParseCommandLine(argc, argv);
  return mneme::forward_bench::Main();
}
