#include "services/worker/worker_runtime.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/model_config.h"
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
  absl::StatusOr<std::unique_ptr<checkpoint::ModelConfig>> config =
      checkpoint::ModelConfig::Create(mo.checkpoint_dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<model::ModelDims> dims = model::LoadModelDims(**config);
  if (!dims.ok()) return dims.status();
  if (absl::Status st = model::CheckTensorParallel(*dims, mo.tp_size);
      !st.ok()) {
    return st;
  }
  if (!dims->engram_layers.empty() && options.engram_store.empty()) {
    return absl::InvalidArgumentError(
        "the model has Engram layers: an engram store address is required");
  }
  std::unique_ptr<WorkerRuntime> rt(new WorkerRuntime());
  switch (options.backend) {
    case BackendKind::kCpu: {
      gpu::CpuBackendOptions bo;
      bo.threads = options.threads;
      absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> b =
          gpu::CpuBackend::Create(bo);
      if (!b.ok()) return b.status();
      rt->backend_ = *std::move(b);
      break;
    }
    default:
      return absl::InvalidArgumentError("backend is unspecified");
  }
  if (mo.tp_size > 1) {
    gpu::GrpcRendezvousStoreOptions so;
    so.target = options.group_address;
    so.key_prefix = options.group_name + "/";
    absl::StatusOr<std::unique_ptr<gpu::GrpcRendezvousStore>> store =
        gpu::GrpcRendezvousStore::Create(so);
    if (!store.ok()) return store.status();
    rt->store_ = *std::move(store);
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
    absl::StatusOr<std::unique_ptr<engram::GrpcEngramClient>> client =
        engram::GrpcEngramClient::Create(eo);
    if (!client.ok()) return client.status();
    rt->engram_ = *std::move(client);
  }
  absl::StatusOr<std::unique_ptr<model::Model>> model = model::Model::Create(
      mo, *rt->backend_, rt->comm_.get(), rt->engram_.get());
  if (!model.ok()) return model.status();
  rt->model_ = *std::move(model);
  return rt;
}

}  // namespace mneme::worker
