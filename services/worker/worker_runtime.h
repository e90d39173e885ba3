#ifndef MNEME_SERVICES_WORKER_WORKER_RUNTIME_H_
#define MNEME_SERVICES_WORKER_WORKER_RUNTIME_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engram_store/client/engram_client.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "gpu/comm/rendezvous_store.h"
#include "model/model.h"

namespace mneme::worker {

// Which Backend (and Communicator) the worker runs on.
enum class BackendKind {
  kUnspecified = 0,
  // CPU backend, Gloo collectives over TCP.
  kCpu = 1,
};

struct WorkerRuntimeOptions {
  // The model and this rank (checkpoint_dir, tp_rank, tp_size, kv_cache).
  // Required: checkpoint_dir.
  model::ModelOptions model;
  // Default: kCpu.
  BackendKind backend = BackendKind::kCpu;
  // Backend threads (CPU); 0 = all cores. Default: 0.
  int threads = 0;
  // "host:port" of the rank-0 worker, whose gRPC server holds the group's
  // rendezvous store (rank 0 may name itself). Required when tp_size > 1.
  std::string group_address;
  // Key prefix of this group in the rendezvous store (a restarted group
  // uses a new one). Default: "mneme".
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
  // Deadline of each Engram lookup. Default: 10 s.
  absl::Duration engram_timeout = absl::Seconds(10);
};

// Everything a worker process runs a model with: the backend, the group's
// rendezvous client and communicator, the engram store client, and the
// model with this rank's shard. Create() joins the group (blocking until
// every rank has, or comm_timeout) and loads the weights.
//
// Thread-compatible; the model is used by one thread at a time.
class WorkerRuntime {
 public:
  // InvalidArgument naming the option for bad options (e.g. a CUDA backend
  // in a build without CUDA is Unavailable); errors of joining (Unavailable,
  // DeadlineExceeded) and of loading the model otherwise.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(
      const WorkerRuntimeOptions& options);
  ~WorkerRuntime();

  model::Model& model() { return *model_; }
  gpu::Backend& backend() { return *backend_; }
  // Null at TP 1.
  gpu::Communicator* comm() { return comm_.get(); }

 private:
  WorkerRuntime() = default;

  std::unique_ptr<gpu::Backend> backend_;
  std::unique_ptr<gpu::RendezvousStore> store_;
  std::unique_ptr<gpu::Communicator> comm_;
  std::unique_ptr<engram::EngramClient> engram_;
  std::unique_ptr<model::Model> model_;
};

}  // namespace mneme::worker

#endif  // MNEME_SERVICES_WORKER_WORKER_RUNTIME_H_
