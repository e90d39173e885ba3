#ifndef MNEME_SERVICES_WORKER_WORKER_RUNTIME_H_
#define MNEME_SERVICES_WORKER_WORKER_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engram_store/client/engram_client.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "gpu/comm/group_membership.h"
#include "model/model.h"
#include "model/spec/dspark.h"

namespace mneme::worker {

// The rendezvous key prefix of generation `generation` of the group
// `group_name`: "<group_name>/gen-<generation>/".
std::string GroupGenerationPrefix(absl::string_view group_name,
                                  int64_t generation);
// Whether `key` belongs to a generation of `group_name` older than
// `generation` (rank 0 erases those from its store after a re-forming).
bool IsSupersededGenerationKey(absl::string_view group_name, int64_t generation,
                               absl::string_view key);

// Which Backend (and Communicator) the worker runs on.
enum class BackendKind {
  kUnspecified = 0,
  // CPU backend, Gloo collectives over TCP.
  kCpu = 1,
  // CUDA backend on one device, NCCL collectives (unique id through the
  // group's rendezvous store).
  kCuda = 2,
};

struct WorkerRuntimeOptions {
  // The model and this rank (checkpoint_dir, tp_rank, tp_size, kv_cache).
  // Required: checkpoint_dir.
  model::ModelOptions model;
  // Default: kCpu.
  BackendKind backend = BackendKind::kCpu;
  // Backend threads (CPU); 0 = all cores. Default: 0.
  int threads = 0;
  // CUDA device index (kCuda), >= 0. Default: 0.
  int device = 0;
  // "host:port" of the rank-0 worker, whose gRPC server holds the group's
  // rendezvous store (rank 0 may name itself). Required when tp_size > 1.
  std::string group_address;
  // Key prefix of this group in the rendezvous store; each generation of
  // the group meets under "<group_name>/gen-<N>/". Default: "mneme".
  std::string group_name = "mneme";
  // The address this rank's collectives listen on (Gloo: an IP or host
  // name of this machine that the peers can reach). Default: 127.0.0.1.
  std::string comm_host = "127.0.0.1";
  // How long joining the group and each collective may take.
  // Default: 120 s.
  absl::Duration comm_timeout = absl::Seconds(120);
  // "host:port" of the node's engram store. Required when the model has
  // Engram layers.
  std::string engram_store;
  // The node's engram store's shared-memory socket (its --shm_socket):
  // lookups go through shared memory, with engram_store (gRPC) as the
  // fallback while the socket cannot be reached. Empty: gRPC only.
  std::string engram_shm_socket;
  // Deadline of each Engram lookup. Default: 10 s.
  absl::Duration engram_timeout = absl::Seconds(10);
};

// Everything a worker process runs a model with: the backend, the group's
// rendezvous client and communicator, the engram store client, and the
// model with this rank's shard. Create() loads the weights; at TP > 1 the
// rank is then in no group until JoinGroup() (the coordinator forms the
// group once every rank is up, and re-forms it after a rank restarted or a
// collective failed, without reloading weights).
//
// Thread-compatible; the model is used by one thread at a time.
class WorkerRuntime {
 public:
  // InvalidArgument naming the option for bad options (e.g. a CUDA backend
  // in a build without CUDA is Unavailable); errors of loading the model
  // otherwise.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(
      const WorkerRuntimeOptions& options);
  ~WorkerRuntime();

  model::Model& model() { return *model_; }
  gpu::Backend& backend() { return *backend_; }
  // The group's communicator (the model's); null at TP 1.
  gpu::GroupMembership* membership() { return comm_.get(); }
  // The model's DSpark drafter when model.max_speculative_tokens > 0
  // (loaded with the model); null otherwise.
  model::DsparkDrafter* drafter() { return drafter_.get(); }

 private:
  WorkerRuntime() = default;

  std::unique_ptr<gpu::Backend> backend_;
  std::unique_ptr<gpu::GroupMembership> comm_;
  // The gRPC client (the fallback when shared memory is used).
  std::unique_ptr<engram::EngramClient> engram_grpc_;
  // What the model calls: engram_grpc_, or the shared-memory client.
  std::unique_ptr<engram::EngramClient> engram_shm_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::DsparkDrafter> drafter_;
};

}  // namespace mneme::worker

#endif  // MNEME_SERVICES_WORKER_WORKER_RUNTIME_H_
