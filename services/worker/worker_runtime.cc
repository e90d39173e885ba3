#include "services/worker/worker_runtime.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "engram_store/client/grpc_engram_client.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/grpc_rendezvous_store.h"
#include "gpu/cpu/cpu_backend.h"

namespace mneme::worker {

WorkerRuntime::~WorkerRuntime() {
  // The model borrows the others.
  model_.reset();
  comm_.reset();
}

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(
    const WorkerRuntimeOptions& options) {
  const model::ModelOptions& mo = options.model;
  if (mo.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint_dir is required");
  }
  if (mo.tp_size < 1 || mo.tp_rank < 0 || mo.tp_rank >= mo.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", mo.tp_rank, " must be in [0, tp_size=", mo.tp_size, ")"));
  }
  if (mo.tp_size > 1 && options.group_address.empty()) {
    return absl::InvalidArgumentError(
        "group_address (the rank-0 worker) is required when tp_size > 1");
  }
  if (options.comm_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("comm_timeout must be positive");
  }
  // Refuse a config that cannot be split before making peers wait.
  ASSIGN_OR_RETURN(
      std::unique_ptr<checkpoint::ModelConfig> config,
      checkpoint::ModelConfig::Create(mo.checkpoint_dir + "/config.json"));
  ASSIGN_OR_RETURN(const model::ModelDims dims, model::LoadModelDims(*config));
  RETURN_IF_ERROR(model::CheckTensorParallel(dims, mo.tp_size));
  if (!dims.engram_layers.empty() && options.engram_store.empty()) {
    return absl::InvalidArgumentError(
        "the model has Engram layers: an engram store address is required");
  }
  std::unique_ptr<WorkerRuntime> rt(new WorkerRuntime());
  switch (options.backend) {
    case BackendKind::kCpu: {
      gpu::CpuBackendOptions bo;
      bo.threads = options.threads;
      ASSIGN_OR_RETURN(rt->backend_, gpu::CpuBackend::Create(bo));
      break;
    }
    default:
      return absl::InvalidArgumentError("backend is unspecified");
  }
  if (mo.tp_size > 1) {
    gpu::GrpcRendezvousStoreOptions so;
    so.target = options.group_address;
    so.key_prefix = options.group_name + "/";
    ASSIGN_OR_RETURN(rt->store_, gpu::GrpcRendezvousStore::Create(so));
    gpu::GlooCommunicatorOptions co;
    co.rank = mo.tp_rank;
    co.size = mo.tp_size;
    co.hostname = options.comm_host;
    co.timeout = options.comm_timeout;
    absl::StatusOr<std::unique_ptr<gpu::GlooCommunicator>> comm =
        gpu::GlooCommunicator::Create(co, *rt->store_);
    if (!comm.ok()) {
      return absl::Status(
          comm.status().code(),
          absl::StrCat("joining the TP group at ", options.group_address, ": ",
                       comm.status().message()));
    }
    rt->comm_ = *std::move(comm);
  }
  if (!options.engram_store.empty()) {
    engram::GrpcEngramClientOptions eo;
    eo.target = options.engram_store;
    eo.timeout = options.engram_timeout;
    ASSIGN_OR_RETURN(rt->engram_, engram::GrpcEngramClient::Create(eo));
  }
  ASSIGN_OR_RETURN(rt->model_,
                   model::Model::Create(mo, *rt->backend_, rt->comm_.get(),
                                        rt->engram_.get()));
  return rt;
}

}  // namespace mneme::worker
