#include "tests/bench/worker/decode_context_bench_lib.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "engram_store/client/engram_client.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "gpu/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/step_io.h"
#include "tests/bench/worker/timing_backend.h"

namespace mneme::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

absl::Status Validate(const DecodeContextOptions& o) {
  if (o.archs.empty()) return absl::InvalidArgumentError("archs is empty");
  if (o.contexts.empty()) {
    return absl::InvalidArgumentError("contexts is empty");
  }
  absl::flat_hash_set<int64_t> seen;
  for (const int64_t c : o.contexts) {
    if (c < 1 || c > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("contexts: ", c, " is outside [1, 2^20]"));
    }
    if (!seen.insert(c).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("contexts: ", c, " appears twice"));
    }
  }
  if (o.chunk_tokens < 1 || o.chunk_tokens > 16384) {
    return absl::InvalidArgumentError("chunk_tokens must be in [1, 16384]");
  }
  if (o.decode_steps < 1 || o.decode_steps > 100000) {
    return absl::InvalidArgumentError("decode_steps must be in [1, 100000]");
  }
  if (o.warmup_steps < 0 || o.warmup_steps > 1000) {
    return absl::InvalidArgumentError("warmup_steps must be in [0, 1000]");
  }
  if (o.threads < 1 || o.threads > 64) {
    return absl::InvalidArgumentError("threads must be in [1, 64]");
  }
  if (o.work_dir.empty()) {
    return absl::InvalidArgumentError("work_dir is required");
  }
  return absl::OkStatus();
}

// What one timed decode step measured.
struct StepSample {
  double wall_s = 0;
  double engram_s = 0;
  BackendTimes backend;
};

// The backend (CPU under a TimingBackend), the Engram store and client
// (models with Engram layers) and the model, destroyed in the right order.
struct Loaded {
  std::unique_ptr<gpu::Backend> cpu;
  std::unique_ptr<TimingBackend> timing;
  std::unique_ptr<engram::EngramStore> store;
  std::unique_ptr<engram::EngramClient> client;
  std::unique_ptr<model::Model> model;

  ~Loaded() {
    model.reset();
    client.reset();
    store.reset();
  }
};

absl::StatusOr<std::unique_ptr<Loaded>> Load(const std::string& dir,
                                             int threads,
                                             int64_t kv_budget_bytes) {
  auto l = std::make_unique<Loaded>();
  gpu::CpuBackendOptions bo;
  bo.threads = threads;
  ASSIGN_OR_RETURN(l->cpu, gpu::CpuBackend::Create(bo));
  l->timing = std::make_unique<TimingBackend>(*l->cpu);
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ModelConfig> config,
                   checkpoint::ModelConfig::Create(dir + "/config.json"));
  if (config->Find("engram_layer_ids") != nullptr) {
    engram::EngramStoreOptions eo;
    eo.checkpoint_dir = dir;
    eo.ram_cache_bytes = uint64_t{64} << 20;
    eo.io_threads = 2;
    ASSIGN_OR_RETURN(l->store, engram::EngramStore::Create(eo));
    l->client = std::make_unique<engram::InProcessEngramClient>(
        l->store.get(), engram::RequestLimits{});
  }
  model::ModelOptions mo;
  mo.checkpoint_dir = dir;
  mo.kv_cache.budget_bytes = kv_budget_bytes;
  ASSIGN_OR_RETURN(
      l->model, model::Model::Create(mo, *l->timing, nullptr, l->client.get()));
  return l;
}

// The p-quantile of `v` by nearest rank (p in (0, 1]); the median is the
// mean of the middle two for an even count.
double Quantile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (p == 0.5) return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  const size_t rank = static_cast<size_t>(std::ceil(p * n));
  return v[std::max<size_t>(rank, 1) - 1];
}

ContextResult Summarize(int64_t context, double prefill_s,
                        double prefill_calls_per_chunk,
                        const std::vector<StepSample>& samples) {
  ContextResult r;
  r.context = context;
  r.prefill_s = prefill_s;
  r.prefill_calls_per_chunk = prefill_calls_per_chunk;
  r.steps = static_cast<int>(samples.size());
  std::vector<double> wall;
  BackendTimes sum;
  double engram = 0, host = 0;
  for (const StepSample& s : samples) {
    wall.push_back(s.wall_s);
    const BackendTimes& b = s.backend;
    sum.attention_s += b.attention_s;
    sum.attention_gather_s += b.attention_gather_s;
    sum.index_scores_s += b.index_scores_s;
    sum.index_gather_s += b.index_gather_s;
    sum.index_copy_s += b.index_copy_s;
    sum.index_select_s += b.index_select_s;
    sum.other_s += b.other_s;
    sum.attended_keys += b.attended_keys;
    sum.index_pairs += b.index_pairs;
    sum.calls += b.calls;
    engram += s.engram_s;
    host += std::max(0.0, s.wall_s - b.backend_total_s() - s.engram_s);
  }
  const double n = static_cast<double>(samples.size());
  const double ms = 1e3 / n;
  r.step_ms_median = 1e3 * Quantile(wall, 0.5);
  r.step_ms_p90 = 1e3 * Quantile(wall, 0.9);
  r.attention_ms = sum.attention_total_s() * ms;
  r.index_ms = sum.index_total_s() * ms;
  r.index_kernel_ms = sum.index_scores_s * ms;
  r.other_backend_ms = sum.other_s * ms;
  r.engram_ms = engram * ms;
  r.host_ms = host * ms;
  r.mean_step_ms = r.attention_ms + r.index_ms + r.other_backend_ms +
                   r.engram_ms + r.host_ms;
  r.attended_keys = static_cast<double>(sum.attended_keys) / n;
  r.index_pairs = static_cast<double>(sum.index_pairs) / n;
  r.calls_per_step = static_cast<double>(sum.calls) / n;
  if (sum.index_pairs > 0) {
    const double pairs = static_cast<double>(sum.index_pairs);
    r.index_kernel_ns_per_pair = sum.index_scores_s * 1e9 / pairs;
    r.index_ns_per_pair = sum.index_total_s() * 1e9 / pairs;
  }
  return r;
}

absl::StatusOr<ModelResult> RunModel(const DecodeContextOptions& o,
                                     synthetic::ReleaseArch arch) {
  ModelResult result;
  result.arch = synthetic::ReleaseArchName(arch);
  const std::string dir = absl::StrCat(o.work_dir, "/", result.arch);
  Clock::time_point t0 = Clock::now();
  synthetic::ReleaseCheckpointOptions co;
  co.out_dir = dir;
  co.arch = arch;
  co.seed = o.seed;
  RETURN_IF_ERROR(synthetic::MakeReleaseCheckpoint(co));
  result.checkpoint_s = Seconds(t0);

  // Load once to learn the KV bytes a token takes, again with a budget
  // that holds every context at once when the default does not.
  t0 = Clock::now();
  const int64_t default_budget = model::KvCacheOptions{}.budget_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<Loaded> loaded,
                   Load(dir, o.threads, default_budget));
  int64_t tokens = 0;
  for (const int64_t c : o.contexts) {
    tokens += c + o.warmup_steps + o.decode_steps;
  }
  const model::Model& probe = *loaded->model;
  const int64_t seqs = static_cast<int64_t>(o.contexts.size());
  const int64_t block_bytes = probe.kv_cache().block_bytes();
  // Per sequence and cached run, up to a block is left partly empty.
  const int64_t need = tokens * probe.KvBytesPerToken() +
                       seqs *
                           (probe.KvFixedBlocksPerSequence() +
                            int64_t{8} * probe.dims().num_layers) *
                           block_bytes;
  result.kv_budget_bytes = default_budget;
  if (need > default_budget) {
    result.kv_budget_bytes = need + need / 4;
    loaded.reset();
    ASSIGN_OR_RETURN(loaded, Load(dir, o.threads, result.kv_budget_bytes));
  }
  result.load_s = Seconds(t0);
  model::Model& model = *loaded->model;
  TimingBackend& timing = *loaded->timing;
  result.weight_bytes = model.weight_bytes();

  int64_t id_limit = model.dims().vocab_size;
  if (model.engram_vocab_size() > 0) {
    id_limit = std::min(id_limit, model.engram_vocab_size());
  }
  if (id_limit < 4) {
    return absl::FailedPreconditionError("the vocabulary is too small");
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> token(3, id_limit - 1);

  // Prefill one sequence per context (ids 1, 2, ...).
  std::vector<double> prefill_s(o.contexts.size());
  std::vector<double> prefill_calls(o.contexts.size());
  for (size_t i = 0; i < o.contexts.size(); ++i) {
    const int64_t context = o.contexts[i];
    timing.Reset();
    int64_t chunks = 0;
    t0 = Clock::now();
    for (int64_t p = 0; p < context; p += o.chunk_tokens, ++chunks) {
      model::SequenceChunk c;
      c.sequence_id = i + 1;
      c.start_position = p;
      const int64_t n = std::min<int64_t>(o.chunk_tokens, context - p);
      c.tokens.resize(n);
      for (int64_t& t : c.tokens) t = token(rng);
      c.logits = p + n == context ? model::SequenceChunk::Logits::kLast
                                  : model::SequenceChunk::Logits::kNone;
      model::StepInput in;
      in.chunks.push_back(std::move(c));
      absl::StatusOr<model::StepOutput> out = model.Step(in);
      if (!out.ok()) {
        return absl::Status(
            out.status().code(),
            absl::StrCat(result.arch, " prefill of ", context, " at ", p, ": ",
                         out.status().message()));
      }
    }
    prefill_s[i] = Seconds(t0);
    prefill_calls[i] = static_cast<double>(timing.times().calls) /
                       static_cast<double>(std::max<int64_t>(chunks, 1));
    std::fprintf(stderr, "%s: prefilled %lld tokens in %.1f s\n",
                 result.arch.c_str(), static_cast<long long>(context),
                 prefill_s[i]);
  }

  // Decode rounds: one step per sequence in turn.
  std::vector<std::vector<StepSample>> samples(o.contexts.size());
  for (int round = 0; round < o.warmup_steps + o.decode_steps; ++round) {
    for (size_t i = 0; i < o.contexts.size(); ++i) {
      model::SequenceChunk c;
      c.sequence_id = i + 1;
      c.start_position = model.SequenceLength(c.sequence_id);
      c.tokens = {token(rng)};
      model::StepInput in;
      in.chunks.push_back(std::move(c));
      timing.Reset();
      const absl::Duration engram0 = model.stats().engram_time;
      const Clock::time_point s0 = Clock::now();
      ASSIGN_OR_RETURN(model::StepOutput out, model.Step(in));
      StepSample s;
      s.wall_s = Seconds(s0);
      s.engram_s = absl::ToDoubleSeconds(model.stats().engram_time - engram0);
      s.backend = timing.times();
      if (out.logits.size() != 1 ||
          out.logits[0].size() !=
              static_cast<size_t>(model.dims().vocab_size)) {
        return absl::InternalError("a decode step returned no logits");
      }
      if (round >= o.warmup_steps) samples[i].push_back(s);
    }
  }
  // Every sequence's next token in one step: the calls a batch makes.
  {
    model::StepInput in;
    for (size_t i = 0; i < o.contexts.size(); ++i) {
      model::SequenceChunk c;
      c.sequence_id = i + 1;
      c.start_position = model.SequenceLength(c.sequence_id);
      c.tokens = {token(rng)};
      in.chunks.push_back(std::move(c));
    }
    timing.Reset();
    ASSIGN_OR_RETURN(model::StepOutput out, model.Step(in));
    result.batched_step_calls = timing.times().calls;
    result.batched_step_calls_by_op = timing.times().calls_by_op;
    result.batched_step_host_waits = timing.times().host_waits;
  }
  for (size_t i = 0; i < o.contexts.size(); ++i) {
    result.contexts.push_back(
        Summarize(o.contexts[i], prefill_s[i], prefill_calls[i], samples[i]));
  }
  const double first = result.contexts[0].step_ms_median;
  for (ContextResult& r : result.contexts) {
    r.vs_first = first > 0 ? r.step_ms_median / first : 0;
  }
  return result;
}

std::string Share(double part, double whole) {
  return whole > 0 ? absl::StrFormat("%.0f%%", 100 * part / whole) : "-";
}

}  // namespace

absl::StatusOr<std::vector<ModelResult>> RunDecodeContextBench(
    const DecodeContextOptions& options) {
  RETURN_IF_ERROR(Validate(options));
  std::vector<ModelResult> results;
  for (const synthetic::ReleaseArch arch : options.archs) {
    ASSIGN_OR_RETURN(ModelResult r, RunModel(options, arch));
    results.push_back(std::move(r));
  }
  return results;
}

std::string FormatTables(const std::vector<ModelResult>& results) {
  std::string s =
      "| model | context | prefill s | calls/chunk | step ms p50 | p90 | "
      "vs first | calls/step | "
      "attention ms (share) | indexer ms (share) | other backend ms | "
      "engram ms | host ms | keys attended/step | indexer pairs/step | "
      "IndexScores ns/pair | indexer ns/pair |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
      "\n";
  for (const ModelResult& m : results) {
    for (const ContextResult& r : m.contexts) {
      absl::StrAppendFormat(
          &s,
          "| %s | %lld | %.1f | %.0f | %.2f | %.2f | %.2f | %.0f | %.2f (%s) | "
          "%.2f (%s) | "
          "%.2f | %.2f | %.2f | %.0f | %.0f | %.2f | %.2f |\n",
          m.arch, static_cast<long long>(r.context), r.prefill_s,
          r.prefill_calls_per_chunk, r.step_ms_median, r.step_ms_p90,
          r.vs_first, r.calls_per_step, r.attention_ms,
          Share(r.attention_ms, r.mean_step_ms), r.index_ms,
          Share(r.index_ms, r.mean_step_ms), r.other_backend_ms, r.engram_ms,
          r.host_ms, r.attended_keys, r.index_pairs, r.index_kernel_ns_per_pair,
          r.index_ns_per_pair);
    }
  }
  for (const ModelResult& m : results) {
    absl::StrAppendFormat(
        &s,
        "\n%s: one decode step of all %d sequences together: %d calls, %d "
        "host waits",
        m.arch, static_cast<int>(m.contexts.size()),
        static_cast<int>(m.batched_step_calls),
        static_cast<int>(m.batched_step_host_waits));
    // The operations in order of their calls, most first.
    std::vector<std::pair<int64_t, std::string>> ops;
    for (const auto& [op, n] : m.batched_step_calls_by_op) {
      ops.emplace_back(n, op);
    }
    std::sort(ops.begin(), ops.end(), std::greater<>());
    std::string list;
    for (const auto& [n, op] : ops) {
      absl::StrAppendFormat(&list, "%s%s %lld", list.empty() ? "" : ", ", op,
                            static_cast<long long>(n));
    }
    absl::StrAppend(&s, " (", list, ")");
  }
  return s;
}

nlohmann::json ToJson(const DecodeContextOptions& options,
                      const std::vector<ModelResult>& results) {
  nlohmann::json models = nlohmann::json::array();
  for (const ModelResult& m : results) {
    nlohmann::json contexts = nlohmann::json::array();
    for (const ContextResult& r : m.contexts) {
      contexts.push_back(
          {{"context", r.context},
           {"prefill_s", r.prefill_s},
           {"prefill_calls_per_chunk", r.prefill_calls_per_chunk},
           {"calls_per_step", r.calls_per_step},
           {"steps", r.steps},
           {"step_ms_median", r.step_ms_median},
           {"step_ms_p90", r.step_ms_p90},
           {"vs_first", r.vs_first},
           {"mean_step_ms", r.mean_step_ms},
           {"attention_ms", r.attention_ms},
           {"index_ms", r.index_ms},
           {"index_kernel_ms", r.index_kernel_ms},
           {"other_backend_ms", r.other_backend_ms},
           {"engram_ms", r.engram_ms},
           {"host_ms", r.host_ms},
           {"attended_keys_per_step", r.attended_keys},
           {"index_pairs_per_step", r.index_pairs},
           {"index_kernel_ns_per_pair", r.index_kernel_ns_per_pair},
           {"index_ns_per_pair", r.index_ns_per_pair}});
    }
    models.push_back({{"arch", m.arch},
                      {"checkpoint_s", m.checkpoint_s},
                      {"load_s", m.load_s},
                      {"weight_bytes", m.weight_bytes},
                      {"kv_budget_bytes", m.kv_budget_bytes},
                      {"batched_step_calls", m.batched_step_calls},
                      {"batched_step_calls_by_op", m.batched_step_calls_by_op},
                      {"batched_step_host_waits", m.batched_step_host_waits},
                      {"contexts", contexts}});
  }
  return {{"benchmark", "decode_context_cpu"},
          {"simd_target", gpu::CpuBackend::SimdTargetName()},
          {"threads", options.threads},
          {"chunk_tokens", options.chunk_tokens},
          {"decode_steps", options.decode_steps},
          {"warmup_steps", options.warmup_steps},
          {"seed", options.seed},
          {"models", models}};
}

}  // namespace mneme::bench
