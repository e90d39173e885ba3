// Decode step time against the context length on the tiny released models
// (V4-Flash and V4.1-Flash), CPU backend: each context is prefilled in
// chunks, then the sequences take decode steps in turn and every step is
// split into attention, indexer scoring, other backend work, Engram
// lookups and host code (decode_context_bench_lib.h, timing_backend.h).
//
//   bazel build -c opt //tests/bench/worker:decode_context_bench
//   bazel-bin/tests/bench/worker/decode_context_bench [--archs=v4-flash,
//       v4.1-flash] [--contexts=1024,8192,32768] [--chunk_tokens=512]
//       [--decode_steps=16] [--warmup_steps=2] [--threads=1] [--seed=3]
//       [--json_out=PATH]
//
// Prints a Markdown table, then the results as JSON (also written to
// --json_out when given). The first context is the yardstick of the
// "vs first" step-time ratios; IndexScores time per scored pair is the
// yardstick of the indexer's growth.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gpu/cpu/cpu_backend.h"
#include "tests/bench/worker/decode_context_bench_lib.h"

ABSL_FLAG(std::string, archs, "v4-flash,v4.1-flash",
          "Comma-separated tiny models to run");
ABSL_FLAG(std::string, contexts, "1024,8192,32768",
          "Comma-separated context lengths in tokens; the first is the "
          "yardstick of the ratios");
ABSL_FLAG(int, chunk_tokens, 512, "Prefill chunk, tokens");
ABSL_FLAG(int, decode_steps, 16, "Timed decode steps per context");
ABSL_FLAG(int, warmup_steps, 2, "Untimed decode steps per context first");
ABSL_FLAG(int, threads, 1, "CPU backend threads");
ABSL_FLAG(uint64_t, seed, 3, "Seed of the checkpoints and the tokens");
ABSL_FLAG(std::string, json_out, "", "Also write the JSON results here");

namespace mneme::bench {
namespace {

int Main() {
  DecodeContextOptions o;
  o.archs.clear();
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_archs), ',', absl::SkipEmpty())) {
    absl::StatusOr<synthetic::ReleaseArch> arch =
        synthetic::ParseReleaseArch(a);
    if (!arch.ok()) {
      std::fprintf(stderr, "--archs: %s\n", arch.status().ToString().c_str());
      return 2;
    }
    o.archs.push_back(*arch);
  }
  o.contexts.clear();
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(c, &v)) {
      std::fprintf(stderr, "--contexts: '%s' is not an integer\n",
                   std::string(c).c_str());
      return 2;
    }
    o.contexts.push_back(v);
  }
  o.chunk_tokens = absl::GetFlag(FLAGS_chunk_tokens);
  o.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.seed = absl::GetFlag(FLAGS_seed);

  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::error_code ec;
  const fs::path base =
      tmp != nullptr ? fs::path(tmp) : fs::temp_directory_path(ec);
  const fs::path dir =
      base / ("decode_context_bench." + std::to_string(::getpid()));
  fs::remove_all(dir, ec);
  o.work_dir = dir.string();

  std::printf(
      "decode step vs context, CPU backend (%s), %d thread(s), %u "
      "hardware threads\n",
      gpu::CpuBackend::SimdTargetName(), o.threads,
      std::thread::hardware_concurrency());
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<ModelResult>> results = RunDecodeContextBench(o);
  fs::remove_all(dir, ec);
  if (!results.ok()) {
    std::fprintf(stderr, "%s\n", results.status().ToString().c_str());
    return 1;
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  nlohmann::json json = ToJson(o, *results);
  json["total_s"] = total_s;
  std::printf("\n%s\ntotal %.1f s\n%s\n", FormatTables(*results).c_str(),
              total_s, json.dump(2).c_str());
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << json.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "writing %s failed\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace mneme::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Decode step time at several context lengths on the tiny V4-Flash and "
      "V4.1-Flash models, split into attention and indexer scoring.");
  absl::ParseCommandLine(argc, argv);
  return mneme::bench::Main();
}
