#ifndef MNEME_TOOLS_CLI_CLUSTER_COMMAND_H_
#define MNEME_TOOLS_CLI_CLUSTER_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme cluster up [--checkpoint DIR] [--tp N] [--dcp N] [--chunk-tokens N]
//     [--workdir DIR] [--bin-dir DIR] [--kv-cache-bytes N]
//     [--max-num-seqs N] [--threads-per-worker N] [--listen HOST:PORT]
//     [--comm-timeout D] [--ready-timeout D] [--num-speculative-tokens K]
//     [--backend cpu|cuda]
// Runs a whole cluster on this machine (tools/cluster/local_cluster.h): an
// engram store, --tp workers (CPU backend, or CUDA with worker R on device
// R and NCCL between them) and the coordinator. Without
// --checkpoint it writes the tiny V4.1-Flash model (MakeReleaseCheckpoint) to
// WORKDIR/checkpoint, or reuses the one already there. WORKDIR (default: a
// new directory under $TMPDIR or /tmp, removed on a clean exit) holds the
// daemons' logs. The daemons come from --bin-dir, else next to this
// executable, else the Bazel output tree or runfiles around it.
//
// Prints to `out`, one line each: `workdir DIR`, `checkpoint DIR`,
// `<daemon> pid P at HOST:PORT` as each daemon starts (daemon
// `engram_store`, `worker R` or `coordinator`; again on every restart),
// then `coordinator at HOST:PORT` (public contract) once the coordinator is
// SERVING. Then stays in the foreground supervising the daemons (a worker
// that exits is restarted together with its group) until SIGINT or
// SIGTERM, stops everything (coordinator, workers, store) and returns OK.
// SIGINT and SIGTERM must not be handled elsewhere in the process: they
// are blocked in the calling thread and taken with sigwait.
//
// Defaults: --tp 1, --dcp 1, --chunk-tokens 8192, --kv-cache-bytes 64 MiB,
// --max-num-seqs 256, --threads-per-worker 1, --listen 127.0.0.1:0,
// --backend cpu,
// --comm-timeout 30s, --ready-timeout 120s. InvalidArgument naming the flag
// for bad flags; NotFound naming the paths tried when the daemons cannot be
// found; the startup error of LocalCluster::Start otherwise (the workdir
// is then kept for its logs).
absl::Status RunCluster(const std::vector<std::string>& argv, std::ostream& out,
                        std::ostream& err);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_CLUSTER_COMMAND_H_
