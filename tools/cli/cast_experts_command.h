#ifndef MNEME_TOOLS_CLI_CAST_EXPERTS_COMMAND_H_
#define MNEME_TOOLS_CLI_CAST_EXPERTS_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme cast-experts --checkpoint SRC --out DST
//     (--calibration FILE.json | --uncalibrated) [--threads N]
// Casts the MXFP4 routed experts (main and draft layers) of SRC to NVFP4
// in a new checkpoint DST without loss where the block exponents allow
// (tools/quant/expert_caster.h); prints the report's totals to `out`
// (the full report is DST/experts-nvfp4.json). Refuses to run without a
// calibration file for the activation input scales unless --uncalibrated
// is given, which the report then records.
absl::Status RunCastExperts(const std::vector<std::string>& argv,
                            std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_CAST_EXPERTS_COMMAND_H_
