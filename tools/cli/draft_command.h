#ifndef MNEME_TOOLS_CLI_DRAFT_COMMAND_H_
#define MNEME_TOOLS_CLI_DRAFT_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme draft --checkpoint DIR --tokens T0,T1,... [--chunk-tokens N]
//     [--threads N] [--json]
// Prefills the prompt on the whole model in this process (TP 1, CPU),
// takes the target's greedy token after it (the anchor) and prints the
// DSpark drafter's greedy proposals that follow it. With --json one object
// (public contract):
//   {"anchor": id, "draft_token_ids": [k ids], "confidence": [k floats]}
// (confidence: the confidence head's logits); without, the same as lines.
// InvalidArgument for a checkpoint without DSpark stages.
absl::Status RunDraft(const std::vector<std::string>& argv, std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_DRAFT_COMMAND_H_
