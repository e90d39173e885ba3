#include "services/worker/worker_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/host_port.h"

ABSL_FLAG(std::string, checkpoint, "", "Checkpoint directory (required).");
ABSL_FLAG(int, rank, 0, "This worker's tensor-parallel rank.");
ABSL_FLAG(int, tp_size, 1, "Tensor-parallel size (workers in the group).");
ABSL_FLAG(std::string, group, "",
          "HOST:PORT of the rank-0 worker (its gRPC address), where the "
          "group meets; required for ranks > 0 (rank 0 defaults to its own "
          "bound address).");
ABSL_FLAG(std::string, group_name, "mneme",
          "Key prefix of the group in the rendezvous store.");
ABSL_FLAG(std::string, comm_host, "127.0.0.1",
          "Address this rank's collectives listen on (reachable by peers).");
ABSL_FLAG(absl::Duration, comm_timeout, absl::Seconds(120),
          "Limit of joining the group and of each collective.");
ABSL_FLAG(std::string, engram_store, "",
          "HOST:PORT of the node's engram store (required for models with "
          "Engram layers).");
ABSL_FLAG(std::string, engram_shm_socket, "",
          "The node's engram store's shared-memory socket (its "
          "--shm_socket); --engram_store stays the fallback. Empty: gRPC "
          "only.");
ABSL_FLAG(absl::Duration, engram_timeout, absl::Seconds(10),
          "Deadline of each Engram lookup.");
ABSL_FLAG(std::string, backend, "cpu",
          "Backend of the model ops: cpu, or cuda (builds with --config=cuda; "
          "NCCL collectives between ranks).");
ABSL_FLAG(int, device, 0, "CUDA device index of --backend=cuda.");
ABSL_FLAG(int, threads, 0, "Backend threads (CPU); 0 = all cores.");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20,
          "KV cache budget of this rank, bytes.");
ABSL_FLAG(int, kv_block_rows, 16, "Entries per KV cache block.");
ABSL_FLAG(int64_t, max_step_tokens, 16384, "Most tokens in one step.");
ABSL_FLAG(int, dcp_size, 1,
          "Decode context parallelism: 1 (off) or --tp_size (the ranks split "
          "the long-range attention entries).");
ABSL_FLAG(int, dcp_interleave, 1,
          "DCP: consecutive entries kept by one rank before the next.");
ABSL_FLAG(int, max_queued_steps, 64, "Steps waiting to run at most.");
ABSL_FLAG(int, num_speculative_tokens, 0,
          "DSpark speculative decoding: the most draft tokens a decode step "
          "may verify, in [0, 64] (0: off; the drafter is loaded when > 0 and "
          "the window rings keep that many positions more for rollback).");

namespace mneme {

absl::StatusOr<worker::WorkerRuntimeOptions> WorkerRuntimeOptionsFromFlags() {
  worker::WorkerRuntimeOptions o;
  o.model.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint);
  if (o.model.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint is required");
  }
  o.model.tp_rank = absl::GetFlag(FLAGS_rank);
  o.model.tp_size = absl::GetFlag(FLAGS_tp_size);
  if (o.model.tp_size < 1 || o.model.tp_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp_size=", o.model.tp_size, " must be in [1, 1024]"));
  }
  if (o.model.tp_rank < 0 || o.model.tp_rank >= o.model.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank=", o.model.tp_rank,
                     " must be in [0, --tp_size=", o.model.tp_size, ")"));
  }
  o.model.dcp_size = absl::GetFlag(FLAGS_dcp_size);
  if (o.model.dcp_size != 1 && o.model.dcp_size != o.model.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dcp_size=", o.model.dcp_size,
                     " must be 1 or --tp_size (", o.model.tp_size, ")"));
  }
  o.model.dcp_interleave = absl::GetFlag(FLAGS_dcp_interleave);
  if (o.model.dcp_interleave < 1 || o.model.dcp_interleave > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp_interleave=", o.model.dcp_interleave, " must be in [1, 2^20]"));
  }
  o.group_address = absl::GetFlag(FLAGS_group);
  if (o.model.tp_size > 1) {
    if (o.group_address.empty() && o.model.tp_rank != 0) {
      return absl::InvalidArgumentError(
          "--group=HOST:PORT (the rank-0 worker) is required when "
          "--tp_size > 1 (rank 0 may leave it out: its own address)");
    }
    if (absl::StatusOr<HostPort> hp = ParseHostPort(o.group_address, "--group");
        !o.group_address.empty() && !hp.ok()) {
      return hp.status();
    }
  }
  o.group_name = absl::GetFlag(FLAGS_group_name);
  if (o.group_name.empty()) {
    return absl::InvalidArgumentError("--group_name must not be empty");
  }
  o.comm_host = absl::GetFlag(FLAGS_comm_host);
  if (o.comm_host.empty()) {
    return absl::InvalidArgumentError("--comm_host must not be empty");
  }
  o.comm_timeout = absl::GetFlag(FLAGS_comm_timeout);
  if (o.comm_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--comm_timeout must be positive");
  }
  o.engram_store = absl::GetFlag(FLAGS_engram_store);
  if (!o.engram_store.empty()) {
    if (absl::StatusOr<HostPort> hp =
            ParseHostPort(o.engram_store, "--engram_store");
        !hp.ok()) {
      return hp.status();
    }
  }
  o.engram_shm_socket = absl::GetFlag(FLAGS_engram_shm_socket);
  o.engram_timeout = absl::GetFlag(FLAGS_engram_timeout);
  if (o.engram_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--engram_timeout must be positive");
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "cpu") {
    o.backend = worker::BackendKind::kCpu;
  } else if (backend == "cuda") {
    o.backend = worker::BackendKind::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", backend, ": the backends are cpu and cuda"));
  }
  o.device = absl::GetFlag(FLAGS_device);
  if (o.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", o.device, " must be >= 0"));
  }
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads < 0 || o.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", o.threads, " must be in [0, 1024]"));
  }
  o.model.kv_cache.budget_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  if (o.model.kv_cache.budget_bytes <= 0) {
    return absl::InvalidArgumentError("--kv_cache_bytes must be positive");
  }
  o.model.kv_cache.block_rows = absl::GetFlag(FLAGS_kv_block_rows);
  if (o.model.kv_cache.block_rows < 1 || o.model.kv_cache.block_rows > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_block_rows=", o.model.kv_cache.block_rows,
                     " must be in [1, 4096]"));
  }
  o.model.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  if (o.model.max_step_tokens < 1) {
    return absl::InvalidArgumentError("--max_step_tokens must be >= 1");
  }
  o.model.max_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  if (o.model.max_speculative_tokens < 0 ||
      o.model.max_speculative_tokens > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_speculative_tokens=", o.model.max_speculative_tokens,
        " must be in [0, 64]"));
  }
  return o;
}

worker::WorkerServiceOptions WorkerServiceOptionsFromFlags() {
  worker::WorkerServiceOptions o;
  o.max_queued_steps = absl::GetFlag(FLAGS_max_queued_steps);
  return o;
}

}  // namespace mneme
