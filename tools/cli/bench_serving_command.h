#ifndef MNEME_TOOLS_CLI_BENCH_SERVING_COMMAND_H_
#define MNEME_TOOLS_CLI_BENCH_SERVING_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme bench serving --server ADDR [--streams N] [--requests M]
//     [--prompt-tokens P] [--max-new-tokens K] [--vocab-size V] [--seed S]
// Closed-loop load on a coordinator: N client streams, each sending its
// share of M requests one after another (prompts of P pseudo-random token
// ids, K new tokens each, eos ignored). Prints one JSON object: requests,
// errors, seconds, output tokens/s, total (prompt + output) tokens/s, and
// p50/p99 of time to first token, inter-token latency and end-to-end
// latency, milliseconds.
absl::Status RunBenchServing(const std::vector<std::string>& argv,
                             std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_BENCH_SERVING_COMMAND_H_
