// Pieces of the worker forward-pass benchmark (forward_bench.cc): the
// configs and scenarios it runs, one rank's run of them (backend,
// communicator, model, timed steps), the summary of a scenario over the
// ranks, and a temporary directory for the synthetic checkpoint.

#ifndef MNEME_TESTS_BENCH_WORKER_FORWARD_BENCH_UTIL_H_
#define MNEME_TESTS_BENCH_WORKER_FORWARD_BENCH_UTIL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engram_store/client/engram_client.h"
#include "gpu/comm/rendezvous_store.h"

namespace mneme::forward_bench {

using Clock = std::chrono::steady_clock;

// A group of `tp` ranks; `name` is "TPt x Nt".
struct Config {
  int tp = 1;
  int threads = 1;  // CpuBackend threads per rank.
  std::string name;
};

// A prefill or decode scenario, run on every config.
struct Scenario {
  enum class Kind { kPrefill, kDecode };
  Kind kind = Kind::kPrefill;
  // Prompt tokens (prefill) or sequences (decode): tokens per step either way.
  int tokens = 0;
  std::string name;
};

// One timed step of one rank: wall time, and the communicator's and the
// Engram lookups' share of it.
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
inline constexpr int kProbeTokens[] = {1, 256};
// Untimed and timed iterations of each.
inline constexpr int kProbeWarmup = 3;
inline constexpr int kProbeIterations[] = {50, 10};

// What every rank of every config shares: the checkpoint, the Engram client,
// the scenarios and the step counts of the flags.
struct Shared {
  std::string checkpoint_dir;
  engram::EngramClient* engram = nullptr;
  std::vector<Scenario> scenarios;
  int warmup_steps = 1;
  int prefill_steps = 3;
  int decode_steps = 16;
  int decode_context = 64;
};

// The positive integers of a comma-separated `text`, the value of --`flag`.
absl::StatusOr<std::vector<int>> ParseInts(absl::string_view flag,
                                           absl::string_view text);

// The configs of --configs: comma-separated "TxN".
absl::StatusOr<std::vector<Config>> ParseConfigs(absl::string_view text);

// One rank of a config: its backend, communicator (TP > 1, meeting its peers
// through `store`) and model, then the yardstick and the scenarios of
// `shared`. Records everything, the status included, in `result`. Destroys
// them before returning (a failing rank thereby closes its connections,
// which ends its peers' collectives).
void RunRank(const Config& config, int rank, const Shared& shared,
             gpu::RendezvousStore* store, RankResult& result);

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

// The row of scenario `s` (`scenario`) on `config` from its ranks' samples;
// vs_first is left 0.
Row Summarize(const Config& config, const Scenario& scenario, size_t s,
              const std::vector<RankResult>& ranks);

// max |a - ref| / (1 + max |ref|); infinity when the sizes differ.
double RelativeDiff(const std::vector<float>& a, const std::vector<float>& ref);

// A temporary directory under TEST_TMPDIR (or /tmp), removed with the
// object.
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Create();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace mneme::forward_bench

#endif  // MNEME_TESTS_BENCH_WORKER_FORWARD_BENCH_UTIL_H_
