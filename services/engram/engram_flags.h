#ifndef MNEME_SERVICES_ENGRAM_ENGRAM_FLAGS_H_
#define MNEME_SERVICES_ENGRAM_ENGRAM_FLAGS_H_

#include "absl/status/statusor.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/engram_service.h"
#include "engram_store/service/shm_server.h"

namespace mneme {

// The engram store daemon's default gRPC and metrics ports.
inline constexpr int kEngramStorePort = 50151;
inline constexpr int kEngramStoreMetricsPort = 50152;

// EngramStoreOptions from the store flags:
//   --checkpoint=DIR (required), --source_open_mode=buffered|direct|nfs,
//   --local_copy_dir, --local_open_mode, --tp_size, --ranks=0,1,...,
//   --column_split=strided|contiguous, --ram_cache_bytes, --rocksdb_dir,
//   --rocksdb_budget_bytes, --io_backend=pread|uring, --io_threads,
//   --prefetch_queue_rows, --prefetch_threads.
// InvalidArgument naming the flag on a malformed value.
absl::StatusOr<engram::EngramStoreOptions> EngramStoreOptionsFromFlags();

// EngramServiceOptions from --max_rows_per_request, --max_rows_per_stream,
// --max_stream_message_bytes, --worker_threads, --max_queued_tasks,
// --default_timeout.
engram::EngramServiceOptions EngramServiceOptionsFromFlags();

// ShmServerOptions from --shm_socket (empty: no shared-memory transport),
// --shm_max_connections and --default_timeout.
engram::ShmServerOptions ShmServerOptionsFromFlags();

}  // namespace mneme

#endif  // MNEME_SERVICES_ENGRAM_ENGRAM_FLAGS_H_
