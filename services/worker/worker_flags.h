#ifndef MNEME_SERVICES_WORKER_WORKER_FLAGS_H_
#define MNEME_SERVICES_WORKER_WORKER_FLAGS_H_

#include "absl/status/statusor.h"
#include "services/worker/worker_runtime.h"
#include "services/worker/worker_service.h"

namespace mneme {

// The worker daemon's default gRPC and metrics ports.
inline constexpr int kWorkerPort = 50161;
inline constexpr int kWorkerMetricsPort = 50162;

// WorkerRuntimeOptions from the worker flags:
//   --checkpoint=DIR (required), --rank, --tp_size, --group=HOST:PORT (the
//   rank-0 worker; required when tp_size > 1), --group_name, --comm_host,
//   --comm_timeout, --engram_store=HOST:PORT, --engram_shm_socket=PATH,
//   --engram_timeout,
//   --backend=cpu|cuda, --device, --threads, --kv_cache_bytes, --kv_block_rows,
//   --max_step_tokens, --dcp_size, --dcp_interleave.
// InvalidArgument naming the flag on a malformed value.
absl::StatusOr<worker::WorkerRuntimeOptions> WorkerRuntimeOptionsFromFlags();

// WorkerServiceOptions from --max_queued_steps.
worker::WorkerServiceOptions WorkerServiceOptionsFromFlags();

}  // namespace mneme

#endif  // MNEME_SERVICES_WORKER_WORKER_FLAGS_H_
