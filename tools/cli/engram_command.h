#ifndef MNEME_TOOLS_CLI_ENGRAM_COMMAND_H_
#define MNEME_TOOLS_CLI_ENGRAM_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// The offline `mneme engram ...` subcommands (public contract: keep names
// and output formats stable):
//   describe --checkpoint DIR
//       JSON: per Engram layer its rows, format, global scale, multipliers,
//       primes, offsets and the compressed vocabulary size.
//   ids --checkpoint DIR --layer L --tokens T0,T1,...
//       One line per position: the row ids of columns 0..C-1, space-separated
//       (the tokens are a whole sequence: position 0 is its start).
//   rows --checkpoint DIR --layer L --ids I0,I1,...
//       One line per id: its decoded values as fp32 ("%.9g"), space-separated.
// `argv` starts with the subcommand word.
absl::Status RunEngramOffline(const std::vector<std::string>& argv,
                              std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_ENGRAM_COMMAND_H_
