#ifndef MNEME_TOOLS_CLI_MAKE_CHECKPOINT_COMMAND_H_
#define MNEME_TOOLS_CLI_MAKE_CHECKPOINT_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme make-checkpoint --out DIR [--engram-format fp8|nvfp4] [--seed N]
//     [--engram-vocab-size N] [--threads N] [--wkv independent|correlated]
//     [--expert-layers L0,L1,...] [--draft-stages N] [--experts N]
// Writes a synthetic V4.1-layout checkpoint (tools/synthetic) and prints
// one summary line to `out`.
absl::Status RunMakeCheckpoint(const std::vector<std::string>& argv,
                               std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_MAKE_CHECKPOINT_COMMAND_H_
