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
//     [--hidden-size N] [--layers N] [--engram-layers L0,L1,...]
//     [--hc-mult N] [--moe-intermediate-size N]
// mneme make-checkpoint --model [--arch v4-flash|v4.1-flash|v4-flash-0731]
//     --out DIR [--full-shapes] [--seed N] [--engram-vocab-size N]
//     [--engram-format fp8|nvfp4] [--threads N] [--aligned-draft]
// Writes a synthetic checkpoint (tools/synthetic) and prints one summary
// line to `out`. Without --model: the Engram layers (and any experts asked
// for), with the library's defaults. With --model: a model of the released
// layout of --arch (default v4.1-flash; release_checkpoint.h), tiny or with
// --full-shapes the release's shapes as sparse files; --aligned-draft (tiny
// v4.1-flash) a model whose DSpark drafter agrees well with it
// (ReleaseCheckpointOptions::aligned_draft). Flags that do not
// apply are InvalidArgument, as are bad values (naming the flag or the
// option).
absl::Status RunMakeCheckpoint(const std::vector<std::string>& argv,
                               std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_MAKE_CHECKPOINT_COMMAND_H_
