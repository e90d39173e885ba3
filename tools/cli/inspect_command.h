#ifndef MNEME_TOOLS_CLI_INSPECT_COMMAND_H_
#define MNEME_TOOLS_CLI_INSPECT_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme inspect DIR
// Prints, for people: the model config, the architecture (model, layer types,
// draft stages, Engram layers, image tensors, expert format) when config.json
// describes a released one, the shards, every tensor (dtype, shape, shard)
// and the Engram configuration with its tables.
absl::Status RunInspect(const std::vector<std::string>& argv,
                        std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_INSPECT_COMMAND_H_
