// The decode-step-vs-context benchmark (decode_context_bench.cc) as a
// library, so a small test can run it: for each tiny released model
// (tools/synthetic/release_checkpoint.h) one sequence per context length is
// prefilled in chunks, then the sequences take decode steps in turn (one
// token each, interleaved so that a noisy machine slows every context
// alike), each step timed through a TimingBackend that splits it into
// attention, indexer scoring, other backend work, Engram lookups and the
// host code between backend calls.

#ifndef MNEME_TESTS_BENCH_WORKER_DECODE_CONTEXT_BENCH_LIB_H_
#define MNEME_TESTS_BENCH_WORKER_DECODE_CONTEXT_BENCH_LIB_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::bench {

struct DecodeContextOptions {
  // Models to run, each a fresh tiny checkpoint. Default: V4-Flash, then
  // V4.1-Flash.
  std::vector<synthetic::ReleaseArch> archs = {
      synthetic::ReleaseArch::kV4Flash, synthetic::ReleaseArch::kV41Flash};
  // Context lengths in tokens, each in [1, 2^20], distinct. The first is
  // the yardstick of the step-time ratios. Default: 1K, 8K, 32K.
  std::vector<int64_t> contexts = {1024, 8192, 32768};
  // Prefill chunk, tokens; range [1, 16384]. Default: 512.
  int chunk_tokens = 512;
  // Timed decode steps per context; range [1, 100000]. Default: 16.
  int decode_steps = 16;
  // Untimed decode steps per context before the timed ones; range [0,
  // 1000]. Default: 2.
  int warmup_steps = 2;
  // CPU backend threads; range [1, 64]. Default: 1.
  int threads = 1;
  // Seed of the checkpoints' values and of the token ids. Default: 3.
  uint64_t seed = 3;
  // Directory the checkpoints are written under (one subdirectory per
  // model, which must not exist yet). Required.
  std::string work_dir;
};

// One context length of one model. Times per timed decode step.
struct ContextResult {
  int64_t context = 0;
  double prefill_s = 0;
  // Backend calls (each a launch or a copy on a GPU) per prefill chunk,
  // and per decode step.
  double prefill_calls_per_chunk = 0;
  double calls_per_step = 0;
  int steps = 0;
  double step_ms_median = 0;
  double step_ms_p90 = 0;
  // step_ms_median / that of the model's first context.
  double vs_first = 0;
  // Means per step, milliseconds: attention (kernel + its key gathers),
  // indexer scoring (IndexScores + its key gathers + the scores' copy to
  // the host), every other backend call, waiting for Engram rows, and what
  // is left of the wall time (host code: top-k selection, bookkeeping).
  double attention_ms = 0;
  double index_ms = 0;
  double index_kernel_ms = 0;  // IndexScores alone (within index_ms).
  double other_backend_ms = 0;
  double engram_ms = 0;
  double host_ms = 0;
  double mean_step_ms = 0;  // The sum of the five above.
  // Per step: keys attended over all attention calls (per query, not per
  // head), and query x entry pairs scored by the indexer.
  double attended_keys = 0;
  double index_pairs = 0;
  // The yardstick of the indexer: IndexScores time per scored pair, and
  // the whole indexer bucket's per pair (0 when nothing was scored).
  double index_kernel_ns_per_pair = 0;
  double index_ns_per_pair = 0;
};

struct ModelResult {
  std::string arch;         // "v4-flash", "v4.1-flash", ...
  double checkpoint_s = 0;  // Writing the tiny checkpoint.
  double load_s = 0;
  int64_t weight_bytes = 0;
  int64_t kv_budget_bytes = 0;
  std::vector<ContextResult> contexts;
  // One decode step of every context's sequence together (a token each),
  // after the timed rounds: its backend calls.
  int64_t batched_step_calls = 0;
  // The same calls by Backend operation.
  std::map<std::string, int64_t> batched_step_calls_by_op;
  // Of those, the calls whose results the host waits for
  // (BackendTimes::host_waits).
  int64_t batched_step_host_waits = 0;
};

// Runs the benchmark. InvalidArgument naming the field for bad options;
// the errors of writing and loading the checkpoints and of the steps
// otherwise. Prints a progress line per phase to stderr.
absl::StatusOr<std::vector<ModelResult>> RunDecodeContextBench(
    const DecodeContextOptions& options);

// The results as Markdown tables (one row per model and context).
std::string FormatTables(const std::vector<ModelResult>& results);

// The options and results as one JSON document.
nlohmann::json ToJson(const DecodeContextOptions& options,
                      const std::vector<ModelResult>& results);

}  // namespace mneme::bench

#endif  // MNEME_TESTS_BENCH_WORKER_DECODE_CONTEXT_BENCH_LIB_H_
