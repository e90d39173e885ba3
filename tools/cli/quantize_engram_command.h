#ifndef MNEME_TOOLS_CLI_QUANTIZE_ENGRAM_COMMAND_H_
#define MNEME_TOOLS_CLI_QUANTIZE_ENGRAM_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme quantize-engram --checkpoint SRC --out DST
//     [--method gptq-mse|gptq-amax|rtn-mse|rtn-amax] [--rows-per-step N]
//     [--threads N] [--wkv-error-rows N] [--verify]
// Converts the FP8 Engram tables of SRC to NVFP4 in a new checkpoint DST
// (tools/quant/engram_quantizer.h); progress goes to stderr, a summary of
// the report (DST/engram-nvfp4.json) to `out`. An interrupted run (Ctrl-C,
// crash, full disk) leaves DST.partial and resumes when run again with the
// same arguments. With --verify the output is re-read and the report
// recomputed before DST appears; if DST already exists, --verify only
// verifies it.
absl::Status RunQuantizeEngram(const std::vector<std::string>& argv,
                               std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_QUANTIZE_ENGRAM_COMMAND_H_
