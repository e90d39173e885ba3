#ifndef MNEME_TOOLS_CLI_ENGRAM_SERVICE_COMMAND_H_
#define MNEME_TOOLS_CLI_ENGRAM_SERVICE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme engram lookup --server ADDR --layer L (--ids I0,I1,... |
//     --tokens T0,T1,... [--context N] [--columns C0,C1,...])
//     [--encoding bf16|fp32] [--stream] [--timeout-ms N]
//     [--tls-ca FILE [--tls-cert FILE --tls-key FILE] [--tls-server-name N]]
//     [--cluster-secret-file FILE]
// Rows from a running engram store (--cluster-secret-file: the store's
// --cluster_secret_file, when it has one). One line per row: its row id, a
// colon, then its values as fp32 ("%.9g"), space-separated. With --tokens the
// first
// --context tokens are context only (rows for the rest, position-major).
// `argv` starts after "lookup".
absl::Status RunEngramLookup(const std::vector<std::string>& argv,
                             std::ostream& out);

// mneme bench engram-service --server ADDR --layer L [--streams N]
//     [--duration-s S] [--tokens-per-step N] [--vocab-size N] [--seed N]
//     [--timeout-ms N] [--tls-* as above]
// Closed-loop load: N concurrent client streams, each a realistic token
// stream (Zipf over [0, vocab-size)), each step a Lookup of the next
// tokens-per-step tokens (with their 3 context tokens, all served columns,
// bf16). Prints JSON: calls, errors, rows/s, bytes/s, p50/p99/max latency.
// `argv` starts after "engram-service".
absl::Status RunBenchEngramService(const std::vector<std::string>& argv,
                                   std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_ENGRAM_SERVICE_COMMAND_H_
