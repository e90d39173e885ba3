#ifndef MNEME_TOOLS_CLI_BENCH_ENGRAM_COMMAND_H_
#define MNEME_TOOLS_CLI_BENCH_ENGRAM_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme bench engram --checkpoint DIR --layer L [--io pread|uring] [--direct]
//     [--threads N] [--tokens-per-step N] [--steps N] [--ram-cache-bytes N]
//     [--seed N] [--local-copy DIR] [--json]
// Drives an EngramStore with a realistic token stream (Zipf-distributed
// tokens over the tokenizer's vocabulary, never a repeated filler token):
// each step hashes the next tokens-per-step tokens (with their lookback) and
// looks up every column's rows as bf16. Reports rows/s, bytes/s and the
// per-step latency percentiles, as JSON with --json.
absl::Status RunBenchEngram(const std::vector<std::string>& argv,
                            std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_BENCH_ENGRAM_COMMAND_H_
