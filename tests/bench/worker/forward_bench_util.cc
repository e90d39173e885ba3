#include "tests/bench/worker/forward_bench_util.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gpu/comm/communicator.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/cpu/cpu_backend.h"
#include "model/model.h"

namespace mneme::forward_bench {
namespace {

// Prompt tokens above the special ids (the synthetic vocabulary has 638).
std::vector<int64_t> Prompt(int length, uint64_t salt) {
  std::vector<int64_t> p(length);
  for (int i = 0; i < length; ++i) {
    p[i] = 3 + static_cast<int64_t>(
                   (static_cast<uint64_t>(i) * 37 + salt * 101) % 600);
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
      RETURN_IF_ERROR(
          comm.AllReduceSum(data.data(), static_cast<int64_t>(data.size())));
      if (i >= kProbeWarmup) {
        times.push_back(
            std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    median_s.push_back(Median(times));
  }
  return absl::OkStatus();
}

}  // namespace

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

namespace {

// RunRank's body: the error of the first step that fails.
absl::Status RunRankSteps(const Config& config, int rank, const Shared& shared,
                          gpu::RendezvousStore* store, RankResult& result) {
  gpu::CpuBackendOptions bo;
  bo.threads = config.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CpuBackend> backend,
                   gpu::CpuBackend::Create(bo));
  std::unique_ptr<gpu::GlooCommunicator> comm;
  if (config.tp > 1) {
    gpu::GlooCommunicatorOptions co;
    co.rank = rank;
    co.size = config.tp;
    co.timeout = absl::Seconds(120);
    ASSIGN_OR_RETURN(comm, gpu::GlooCommunicator::Create(co, *store));
  }
  model::ModelOptions mo;
  mo.checkpoint_dir = shared.checkpoint_dir;
  mo.tp_rank = rank;
  mo.tp_size = config.tp;
  mo.kv_cache.budget_bytes = int64_t{16} << 20;
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(
      std::unique_ptr<model::Model> model,
      model::Model::Create(mo, *backend, comm.get(), shared.engram));
  result.load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  result.weight_bytes = model->weight_bytes();
  result.hidden = model->dims().hidden_size;
  if (comm != nullptr) {
    RETURN_IF_ERROR(ProbeAllReduce(*comm, result.hidden, result.allreduce_s));
  }
  Rank runner(*model, comm.get(), shared);
  return runner.Run(result);
}

}  // namespace

void RunRank(const Config& config, int rank, const Shared& shared,
             gpu::RendezvousStore* store, RankResult& result) {
  result.status = RunRankSteps(config, rank, shared, store, result);
}

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

absl::StatusOr<std::unique_ptr<TempDir>> TempDir::Create() {
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

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) {
    std::fprintf(stderr, "removing %s: %s\n", path_.c_str(),
                 ec.message().c_str());
  }
}

}  // namespace mneme::forward_bench
