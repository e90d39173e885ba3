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
// The model is the tiny synthetic one (synthetic::TinyModelOptions()),
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

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "gpu/comm/communicator.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/in_memory_rendezvous_store.h"
#include "gpu/cpu/cpu_backend.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/synthetic_checkpoint.h"

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

namespace mneme {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int tp = 1;
  int threads = 1;  // CpuBackend threads per rank.
  std::string name;
};

struct Scenario {
  enum class Kind { kPrefill, kDecode };
  Kind kind = Kind::kPrefill;
  // Prompt tokens (prefill) or sequences (decode): tokens per step either way.
  int tokens = 0;
  std::string name;
};

struct StepSample {
  double wall_s = 0;
  double comm_s = 0;
  double engram_s = 0;
  int64_t comm_calls = 0;
  int64_t comm_bytes = 0;
};

// What one rank of one config measured.
struct RankResult {
  absl::Status status;
  double load_s = 0;
  int64_t weight_bytes = 0;
  int64_t hidden = 0;
  // Per scenario, the timed steps in order.
  std::vector<std::vector<StepSample>> samples;
  // Logits of the first step (the first scenario's first step).
  std::vector<float> first_logits;
  // The yardstick (TP > 1): median seconds of a bare AllReduceSum of
  // kProbeTokens[i] x hidden floats on the same communicator.
  std::vector<double> allreduce_s;
};

// Token counts of the yardstick all-reduces: one decode token's activation
// and a 256-token prefill's.
constexpr int kProbeTokens[] = {1, 256};
constexpr int kProbeWarmup = 3;
constexpr int kProbeIterations[] = {50, 10};

struct Shared {
  std::string checkpoint_dir;
  engram::EngramClient* engram = nullptr;
  std::vector<Scenario> scenarios;
  int warmup_steps = 1;
  int prefill_steps = 3;
  int decode_steps = 16;
  int decode_context = 64;
};

absl::StatusOr<std::vector<int>> ParseInts(absl::string_view flag,
                                           absl::string_view text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a positive integer"));
    }
    out.push_back(v);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  }
  return out;
}

absl::StatusOr<std::vector<Config>> ParseConfigs(absl::string_view text) {
  std::vector<Config> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> tn = absl::StrSplit(part, 'x');
    Config c;
    if (tn.size() != 2 || !absl::SimpleAtoi(tn[0], &c.tp) ||
        !absl::SimpleAtoi(tn[1], &c.threads) || c.tp < 1 || c.threads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--configs: '", part, "' is not TxN"));
    }
    c.name = absl::StrCat("TP", c.tp, " x ", c.threads, "t");
    out.push_back(c);
  }
  if (out.empty()) return absl::InvalidArgumentError("--configs is empty");
  return out;
}

// Prompt tokens above the special ids (the synthetic vocabulary has 638).
std::vector<int64_t> Prompt(int length, uint64_t salt) {
  std::vector<int64_t> p(length);
  for (int i = 0; i < length; ++i) {
    p[i] = 3 + static_cast<int64_t>((i * 37 + salt * 101) % 600);
  }
  return p;
}

int64_t DecodeToken(uint64_t id, int64_t position) {
  return 3 + static_cast<int64_t>((id * 131 + position * 37) % 600);
}

// One rank's model and communicator; runs the scenarios.
class Rank {
 public:
  Rank(model::Model& model, gpu::Communicator* comm, const Shared& shared)
      : model_(model), comm_(comm), shared_(shared) {}

  absl::Status Run(RankResult& result) {
    result.samples.resize(shared_.scenarios.size());
    for (size_t s = 0; s < shared_.scenarios.size(); ++s) {
      const Scenario& sc = shared_.scenarios[s];
      absl::Status st = sc.kind == Scenario::Kind::kPrefill
                            ? Prefill(sc.tokens, result, result.samples[s])
                            : Decode(sc.tokens, result, result.samples[s]);
      if (!st.ok()) {
        return absl::Status(st.code(),
                            absl::StrCat(sc.name, ": ", st.message()));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<StepSample> TimedStep(const model::StepInput& input,
                                       RankResult& result) {
    const gpu::CommStats c0 = comm_ ? comm_->stats() : gpu::CommStats{};
    const absl::Duration e0 = model_.stats().engram_time;
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<model::StepOutput> out = model_.Step(input);
    const Clock::time_point t1 = Clock::now();
    if (!out.ok()) return out.status();
    const gpu::CommStats c1 = comm_ ? comm_->stats() : gpu::CommStats{};
    StepSample sample;
    sample.wall_s = std::chrono::duration<double>(t1 - t0).count();
    sample.comm_s = absl::ToDoubleSeconds(c1.time - c0.time);
    sample.engram_s = absl::ToDoubleSeconds(model_.stats().engram_time - e0);
    sample.comm_calls = c1.calls - c0.calls;
    sample.comm_bytes = c1.bytes - c0.bytes;
    if (result.first_logits.empty() && !out->logits.empty()) {
      result.first_logits = out->logits[0];
    }
    return sample;
  }

  absl::Status Prefill(int length, RankResult& result,
                       std::vector<StepSample>& samples) {
    const int steps = shared_.warmup_steps + shared_.prefill_steps;
    for (int i = 0; i < steps; ++i) {
      const uint64_t id = next_id_++;
      model::StepInput input;
      model::SequenceChunk chunk;
      chunk.sequence_id = id;
      chunk.tokens = Prompt(length, id);
      input.chunks.push_back(std::move(chunk));
      absl::StatusOr<StepSample> sample = TimedStep(input, result);
      model_.Release(id);
      if (!sample.ok()) return sample.status();
      if (i >= shared_.warmup_steps) samples.push_back(*sample);
    }
    return absl::OkStatus();
  }

  absl::Status Decode(int batch, RankResult& result,
                      std::vector<StepSample>& samples) {
    std::vector<uint64_t> ids;
    model::StepInput prefill;
    for (int b = 0; b < batch; ++b) {
      ids.push_back(next_id_++);
      model::SequenceChunk chunk;
      chunk.sequence_id = ids.back();
      chunk.tokens = Prompt(shared_.decode_context, ids.back());
      prefill.chunks.push_back(std::move(chunk));
    }
    absl::Status st = TimedStep(prefill, result).status();
    const int steps = shared_.warmup_steps + shared_.decode_steps;
    for (int i = 0; i < steps && st.ok(); ++i) {
      const int64_t position = shared_.decode_context + i;
      model::StepInput input;
      for (uint64_t id : ids) {
        model::SequenceChunk chunk;
        chunk.sequence_id = id;
        chunk.tokens = {DecodeToken(id, position)};
        chunk.start_position = position;
        input.chunks.push_back(std::move(chunk));
      }
      absl::StatusOr<StepSample> sample = TimedStep(input, result);
      if (!sample.ok()) {
        st = sample.status();
      } else if (i >= shared_.warmup_steps) {
        samples.push_back(*sample);
      }
    }
    for (uint64_t id : ids) model_.Release(id);
    return st;
  }

  model::Model& model_;
  gpu::Communicator* const comm_;
  const Shared& shared_;
  uint64_t next_id_ = 1;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times bare all-reduces of the sizes the model's own all-reduces have, on
// the model's communicator (every rank runs the same calls).
absl::Status ProbeAllReduce(gpu::Communicator& comm, int64_t hidden,
                            std::vector<double>& median_s) {
  for (size_t p = 0; p < std::size(kProbeTokens); ++p) {
    std::vector<float> data(static_cast<size_t>(kProbeTokens[p] * hidden),
                            1.0f);
    std::vector<double> times;
    for (int i = 0; i < kProbeWarmup + kProbeIterations[p]; ++i) {
      const Clock::time_point t0 = Clock::now();
      absl::Status st =
          comm.AllReduceSum(data.data(), static_cast<int64_t>(data.size()));
      if (!st.ok()) return st;
      if (i >= kProbeWarmup) {
        times.push_back(
            std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    median_s.push_back(Median(times));
  }
  return absl::OkStatus();
}

// One rank of a config: its backend, communicator (TP > 1) and model, then
// the scenarios. Destroys them before returning (a failing rank thereby
// closes its connections, which ends its peers' collectives).
void RunRank(const Config& config, int rank, const Shared& shared,
             gpu::RendezvousStore* store, RankResult& result) {
  gpu::CpuBackendOptions bo;
  bo.threads = config.threads;
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create(bo);
  if (!backend.ok()) {
    result.status = backend.status();
    return;
  }
  std::unique_ptr<gpu::GlooCommunicator> comm;
  if (config.tp > 1) {
    gpu::GlooCommunicatorOptions co;
    co.rank = rank;
    co.size = config.tp;
    co.timeout = absl::Seconds(120);
    absl::StatusOr<std::unique_ptr<gpu::GlooCommunicator>> c =
        gpu::GlooCommunicator::Create(co, *store);
    if (!c.ok()) {
      result.status = c.status();
      return;
    }
    comm = *std::move(c);
  }
  model::ModelOptions mo;
  mo.checkpoint_dir = shared.checkpoint_dir;
  mo.tp_rank = rank;
  mo.tp_size = config.tp;
  mo.kv_cache.budget_bytes = int64_t{16} << 20;
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Create(mo, **backend, comm.get(), shared.engram);
  if (!model.ok()) {
    result.status = model.status();
    return;
  }
  result.load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  result.weight_bytes = (*model)->weight_bytes();
  result.hidden = (*model)->dims().hidden_size;
  if (comm != nullptr) {
    absl::Status st = ProbeAllReduce(*comm, result.hidden, result.allreduce_s);
    if (!st.ok()) {
      result.status = st;
      return;
    }
  }
  Rank runner(**model, comm.get(), shared);
  result.status = runner.Run(result);
}

// One row of the results: a scenario on a config.
struct Row {
  std::string config;
  int tp = 1;
  int threads = 1;
  std::string scenario;
  int tokens_per_step = 0;
  int steps = 0;
  double step_ms_median = 0;
  double step_ms_min = 0;
  double tokens_per_s = 0;
  double vs_first = 0;  // tokens_per_s / that of the first config.
  double comm_share = 0;
  double engram_share = 0;
  double collectives_per_step = 0;
  double comm_kib_per_step = 0;  // Payload this rank contributed.
};

Row Summarize(const Config& config, const Scenario& scenario, size_t s,
              const std::vector<RankResult>& ranks) {
  Row row;
  row.config = config.name;
  row.tp = config.tp;
  row.threads = config.threads;
  row.scenario = scenario.name;
  row.tokens_per_step = scenario.tokens;
  const size_t steps = ranks[0].samples[s].size();
  row.steps = static_cast<int>(steps);
  std::vector<double> step_s(steps, 0.0);
  double comm_share = 0, engram_share = 0, calls = 0, bytes = 0;
  for (const RankResult& r : ranks) {
    double wall = 0, comm = 0, engram = 0;
    for (size_t i = 0; i < steps; ++i) {
      const StepSample& x = r.samples[s][i];
      step_s[i] += x.wall_s / static_cast<double>(ranks.size());
      wall += x.wall_s;
      comm += x.comm_s;
      engram += x.engram_s;
      calls += static_cast<double>(x.comm_calls);
      bytes += static_cast<double>(x.comm_bytes);
    }
    if (wall > 0) {
      comm_share += comm / wall;
      engram_share += engram / wall;
    }
  }
  const double n = static_cast<double>(ranks.size());
  row.comm_share = comm_share / n;
  row.engram_share = engram_share / n;
  if (steps > 0) {
    row.collectives_per_step = calls / n / static_cast<double>(steps);
    row.comm_kib_per_step = bytes / n / static_cast<double>(steps) / 1024.0;
    const double median = Median(step_s);
    row.step_ms_median = median * 1e3;
    row.step_ms_min = *std::min_element(step_s.begin(), step_s.end()) * 1e3;
    row.tokens_per_s = median > 0 ? scenario.tokens / median : 0;
  }
  return row;
}

// max |a - ref| / (1 + max |ref|); infinity when the sizes differ.
double RelativeDiff(const std::vector<float>& a,
                    const std::vector<float>& ref) {
  if (a.size() != ref.size() || ref.empty()) return INFINITY;
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[i]) -
                                            static_cast<double>(ref[i])));
  }
  return max_diff / (1 + max_ref);
}

// A temporary directory under TEST_TMPDIR (or /tmp), removed with the
// object.
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Create() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl =
        absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp",
                     "/forward_bench.XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("mkdtemp(", tmpl, "): ", std::strerror(errno)));
    }
    return std::unique_ptr<TempDir>(new TempDir(tmpl));
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec) {
      std::fprintf(stderr, "removing %s: %s\n", path_.c_str(),
                   ec.message().c_str());
    }
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

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
    synthetic::SyntheticCheckpointOptions so = synthetic::TinyModelOptions();
    so.out_dir = tmp->path() + "/ckpt";
    if (absl::Status st = synthetic::MakeSyntheticCheckpoint(so); !st.ok()) {
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
}  // namespace mneme

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Throughput of the worker's CPU forward pass at TP 1, 2 and 4 (ranks as "
      "threads over Gloo on 127.0.0.1) and the share of step time in "
      "collectives.");
  absl::ParseCommandLine(argc, argv);
  return mneme::Main();
}
