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
// mneme make-checkpoint --model --out DIR [the flags above but
//     --expert-layers and --draft-stages] [--heads N] [--head-dim N]
//     [--top-k N] [--sliding-window N] [--compress-ratios R0,R1,...]
// Writes a synthetic V4.1-layout checkpoint (tools/synthetic) and prints
// one summary line to `out`. Without --model: the Engram layers (and any
// experts asked for), with the library's defaults. With --model: the
// complete tiny model of docs/MODEL_LAYOUT.md (TinyModelOptions: hidden 256,
// 4 layers, Engram layers 1 and 3, 16 experts top-2, hc_mult 4), the flags
// overriding its dimensions; --layers without --compress-ratios repeats the
// ratios 0, 1, 2, 4 over the layers. The model-only flags without --model
// are InvalidArgument, as are bad values (naming the flag or the option).
absl::Status RunMakeCheckpoint(const std::vector<std::string>& argv,
                               std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_MAKE_CHECKPOINT_COMMAND_H_
