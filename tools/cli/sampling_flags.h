#ifndef MNEME_TOOLS_CLI_SAMPLING_FLAGS_H_
#define MNEME_TOOLS_CLI_SAMPLING_FLAGS_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "tools/cli/args.h"

namespace mneme::cli {

// The sampling flags every generating command takes: --temperature (0 =
// greedy, up to 100), --top-p (0, 1], --top-k (0 = off), --min-p [0, 1],
// --seed.

// `flags` plus the sampling flags (a command's value flags for Args::Parse).
std::set<std::string> WithSamplingFlags(std::set<std::string> flags);

// InvalidArgument naming the flag for a value out of range.
absl::StatusOr<gpu::SamplingParams> SamplingFromArgs(const Args& args);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_SAMPLING_FLAGS_H_
