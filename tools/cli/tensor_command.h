#ifndef MNEME_TOOLS_CLI_TENSOR_COMMAND_H_
#define MNEME_TOOLS_CLI_TENSOR_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// `mneme tensor --checkpoint DIR --name NAME --npy FILE [--threads N]`:
// the linear weight NAME (a module such as layers.0.ffn.experts.3.w1, or
// one of its tensors' names) of any format the loader serves - BF16 / F32,
// FP8 block, MXFP4, NVFP4, EXL3, GridBook (stacked experts included) - as
// float32 [rows = output features, cols = input features], the values the
// model multiplies by, written as a .npy file. Prints one line (or --json)
// naming the format, the shape and the stored bytes.
absl::Status RunTensor(const std::vector<std::string>& argv, std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_TENSOR_COMMAND_H_
