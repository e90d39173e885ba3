#ifndef MNEME_TOOLS_CLI_LOCALIZE_COMMAND_H_
#define MNEME_TOOLS_CLI_LOCALIZE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme localize --checkpoint DIR --out DIR --tp N --rank R[,R...]
//     [--split strided|contiguous] [--threads N] [--force]
// Makes (or resumes, or checks and repairs) the sparse local copy of the
// Engram rows that rank(s) R of a TP-N group serve (engram_store/local_copy):
// data files plus a manifest under --out. --split defaults to strided and
// must match the store's; --force replaces a copy of another checkpoint or
// target. Prints a summary to `out` (public contract, keep stable):
//   localized <target> from <checkpoint> into <out>
//   layer <L>: <format>, <rows> rows, <bytes> bytes, <ranges> ranges
//   total: <rows> rows, <bytes> bytes, <ranges> ranges (<copied> copied,
//       <reused> already present), <seconds> s, <MB/s> MB/s     (one line)
//   manifest: <path>
// and, for copies of 1 GiB or more, progress lines on `err` (at most one
// every 2 s). `argv` follows the command word.
absl::Status RunLocalize(const std::vector<std::string>& argv,
                         std::ostream& out, std::ostream& err);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_LOCALIZE_COMMAND_H_
