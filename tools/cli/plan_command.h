#ifndef MNEME_TOOLS_CLI_PLAN_COMMAND_H_
#define MNEME_TOOLS_CLI_PLAN_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::cli {

// mneme plan --checkpoint DIR --tp N --dcp N --kv-cache-bytes B
//            [--kv-block-rows N] [--dcp-interleave N] [--json]
// From config.json and the safetensors headers only (never the tensor
// data, so it runs on sparse full-shape checkpoints): the weight bytes each
// tensor-parallel rank loads, as stored on disk and split as the worker's
// loader splits them (draft stages, Engram tables and vision tensors
// apart); the KV bytes per token by layer type, in the worker's pool (fp32
// rows of head_dim floats, per rank under DCP) and in the release's compact
// storage; the fixed bytes per sequence; and for B bytes of KV cache per
// rank the pool in tokens and the longest single sequence it holds.
absl::Status RunPlan(const std::vector<std::string>& argv, std::ostream& out);

// A byte count: a non-negative integer with an optional unit, B, KB / MB /
// GB / TB (powers of 1000) or KiB / MiB / GiB / TiB (powers of 1024), e.g.
// "6GiB", "1.5GiB", "805306368". At most 2^50. InvalidArgument naming
// `flag` otherwise.
absl::StatusOr<int64_t> ParseByteCount(absl::string_view flag,
                                       absl::string_view text);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_PLAN_COMMAND_H_
