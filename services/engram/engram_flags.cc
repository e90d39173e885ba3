#include "services/engram/engram_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engram_store/hashing/column_split.h"

ABSL_FLAG(std::string, checkpoint, "", "Checkpoint directory (required).");
ABSL_FLAG(std::string, source_open_mode, "buffered",
          "How checkpoint shards are read: buffered, direct or nfs.");
ABSL_FLAG(std::string, local_copy_dir, "",
          "Sparse local copy of this node's rows (mneme localize).");
ABSL_FLAG(std::string, local_open_mode, "buffered",
          "How the local copy is read: buffered, direct or nfs.");
ABSL_FLAG(int, tp_size, 1, "Tensor-parallel size.");
ABSL_FLAG(std::string, ranks, "0", "Ranks served, comma-separated.");
ABSL_FLAG(std::string, column_split, "strided",
          "How hash columns are split across ranks: strided or contiguous.");
ABSL_FLAG(uint64_t, ram_cache_bytes, uint64_t{1} << 30,
          "RAM row cache budget in bytes (0 disables it).");
ABSL_FLAG(std::string, rocksdb_dir, "", "RocksDB row tier directory.");
ABSL_FLAG(uint64_t, rocksdb_budget_bytes, uint64_t{64} << 30,
          "RocksDB row tier disk budget in bytes.");
ABSL_FLAG(std::string, io_backend, "pread", "Row reader: pread or uring.");
ABSL_FLAG(int, io_threads, 16, "Reader threads (pread) or rings (uring).");
ABSL_FLAG(int64_t, prefetch_queue_rows, int64_t{1} << 20,
          "Most rows waiting to be prefetched.");
ABSL_FLAG(int, prefetch_threads, 2, "Threads running prefetches.");
ABSL_FLAG(int64_t, max_rows_per_request, 65536,
          "Most rows per Lookup or Prefetch request.");
ABSL_FLAG(int64_t, max_rows_per_stream, int64_t{1} << 20,
          "Most rows per LookupStream request.");
ABSL_FLAG(int64_t, max_stream_message_bytes, int64_t{4} << 20,
          "Most row bytes per LookupStream message.");
ABSL_FLAG(int, worker_threads, 8, "Threads serving lookups.");
ABSL_FLAG(int64_t, max_queued_tasks, 1024,
          "Most lookups waiting for a worker thread.");
ABSL_FLAG(std::string, shm_socket, "",
          "Unix socket of the same-node shared-memory transport (workers on "
          "this node pass it as --engram_shm_socket); empty = off.");
ABSL_FLAG(int, shm_max_connections, 64,
          "Shared-memory connections served at once.");
ABSL_FLAG(absl::Duration, shm_spin, absl::Microseconds(20),
          "How long a shared-memory connection spins for the worker's next "
          "message before it blocks, 0 to 10ms (0 = never spin): longer "
          "catches more back-to-back calls without a wake-up, at the cost of "
          "a core that long after each call.");
ABSL_FLAG(absl::Duration, default_timeout, absl::Seconds(30),
          "Deadline of calls that carry none.");

namespace mneme {
namespace {

absl::StatusOr<engram::OpenMode> ParseOpenMode(absl::string_view flag,
                                               absl::string_view value) {
  if (value == "buffered") return engram::OpenMode::kBuffered;
  if (value == "direct") return engram::OpenMode::kDirect;
  if (value == "nfs") return engram::OpenMode::kNfs;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, ": expected buffered, direct or nfs, got '", value, "'"));
}

}  // namespace

absl::StatusOr<engram::EngramStoreOptions> EngramStoreOptionsFromFlags() {
  engram::EngramStoreOptions o;
  o.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint);
  if (o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint is required");
  }
  ASSIGN_OR_RETURN(
      o.source_open_mode,
      ParseOpenMode("source_open_mode", absl::GetFlag(FLAGS_source_open_mode)));
  o.local_copy_dir = absl::GetFlag(FLAGS_local_copy_dir);
  ASSIGN_OR_RETURN(
      o.local_open_mode,
      ParseOpenMode("local_open_mode", absl::GetFlag(FLAGS_local_open_mode)));
  o.tp_size = absl::GetFlag(FLAGS_tp_size);
  o.ranks.clear();
  const std::string ranks = absl::GetFlag(FLAGS_ranks);
  for (absl::string_view r : absl::StrSplit(ranks, ',')) {
    int rank = 0;
    if (!absl::SimpleAtoi(r, &rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ranks: '", r, "' is not an integer"));
    }
    o.ranks.push_back(rank);
  }
  absl::StatusOr<engram::ColumnSplit> split =
      engram::ParseColumnSplit(absl::GetFlag(FLAGS_column_split));
  if (!split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--column_split: ", split.status().message()));
  }
  o.split = *split;
  o.ram_cache_bytes = absl::GetFlag(FLAGS_ram_cache_bytes);
  o.rocksdb_dir = absl::GetFlag(FLAGS_rocksdb_dir);
  o.rocksdb_budget_bytes = absl::GetFlag(FLAGS_rocksdb_budget_bytes);
  const std::string io = absl::GetFlag(FLAGS_io_backend);
  if (io == "pread") {
    o.io_backend = engram::IoBackend::kPread;
  } else if (io == "uring") {
    o.io_backend = engram::IoBackend::kUring;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--io_backend: expected pread or uring, got '", io, "'"));
  }
  o.io_threads = absl::GetFlag(FLAGS_io_threads);
  o.prefetch_queue_rows = absl::GetFlag(FLAGS_prefetch_queue_rows);
  o.prefetch_threads = absl::GetFlag(FLAGS_prefetch_threads);
  RETURN_IF_ERROR(engram::ValidateEngramStoreOptions(o));
  return o;
}

engram::EngramServiceOptions EngramServiceOptionsFromFlags() {
  engram::EngramServiceOptions o;
  o.limits.max_rows_per_request = absl::GetFlag(FLAGS_max_rows_per_request);
  o.limits.max_rows_per_stream = absl::GetFlag(FLAGS_max_rows_per_stream);
  o.limits.max_stream_message_bytes =
      absl::GetFlag(FLAGS_max_stream_message_bytes);
  o.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  o.max_queued_tasks = absl::GetFlag(FLAGS_max_queued_tasks);
  o.default_timeout = absl::GetFlag(FLAGS_default_timeout);
  return o;
}

engram::ShmServerOptions ShmServerOptionsFromFlags() {
  engram::ShmServerOptions o;
  o.socket_path = absl::GetFlag(FLAGS_shm_socket);
  o.max_connections = absl::GetFlag(FLAGS_shm_max_connections);
  o.spin = absl::GetFlag(FLAGS_shm_spin);
  o.default_timeout = absl::GetFlag(FLAGS_default_timeout);
  return o;
}

}  // namespace mneme
