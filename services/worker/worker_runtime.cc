#include "services/worker/worker_runtime.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/client/shm_engram_client.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/grpc_rendezvous_store.h"
#include "gpu/comm/nccl_communicator.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/cuda_backend.h"

namespace mneme::worker {
namespace {

// A communicator whose collectives start after the backend's queued work:
// the CUDA backend queues its kernels on its own stream and NCCL runs on
// another, so the buffers a collective reads are complete only after the
// backend's Synchronize. (A collective is complete when the call returns.)
class BackendOrderedCommunicator final : public gpu::Communicator {
 public:
  BackendOrderedCommunicator(std::unique_ptr<gpu::Communicator> inner,
                             gpu::Backend* backend)
      : inner_(std::move(inner)), backend_(backend) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(float* data, int64_t count) override {
    RETURN_IF_ERROR(backend_->Synchronize());
    return inner_->AllReduceSum(data, count);
  }
  absl::Status AllGather(const float* in, int64_t count, float* out) override {
    RETURN_IF_ERROR(backend_->Synchronize());
    return inner_->AllGather(in, count, out);
  }
  absl::Status ReduceScatterSum(const float* in, int64_t count,
                                float* out) override {
    RETURN_IF_ERROR(backend_->Synchronize());
    return inner_->ReduceScatterSum(in, count, out);
  }
  absl::Status Broadcast(float* data, int64_t count, int root) override {
    RETURN_IF_ERROR(backend_->Synchronize());
    return inner_->Broadcast(data, count, root);
  }
  absl::Status Barrier() override {
    RETURN_IF_ERROR(backend_->Synchronize());
    return inner_->Barrier();
  }
  gpu::CommStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<gpu::Communicator> inner_;
  gpu::Backend* backend_;
};

}  // namespace

std::string GroupGenerationPrefix(absl::string_view group_name,
                                  int64_t generation) {
  return absl::StrCat(group_name, "/gen-", generation, "/");
}

bool IsSupersededGenerationKey(absl::string_view group_name, int64_t generation,
                               absl::string_view key) {
  const std::string head = absl::StrCat(group_name, "/gen-");
  if (!absl::ConsumePrefix(&key, head)) return false;
  const size_t slash = key.find('/');
  int64_t g = 0;
  return slash != absl::string_view::npos &&
         absl::SimpleAtoi(key.substr(0, slash), &g) && g < generation;
}

WorkerRuntime::~WorkerRuntime() {
  // The drafter borrows the model; the model the others.
  drafter_.reset();
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
    case BackendKind::kCuda: {
      if (options.device < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("device must be >= 0, got ", options.device));
      }
      ASSIGN_OR_RETURN(rt->backend_, gpu::CreateCudaBackend(options.device));
      break;
    }
    default:
      return absl::InvalidArgumentError("backend is unspecified");
  }
  gpu::Backend* const backend = rt->backend_.get();
  if (mo.tp_size > 1) {
    // Each generation meets under its own prefix, so a re-formed group
    // never reads a predecessor's addresses.
    auto form = [options, backend](int64_t generation)
        -> absl::StatusOr<std::unique_ptr<gpu::Communicator>> {
      gpu::GrpcRendezvousStoreOptions so;
      so.target = options.group_address;
      so.key_prefix = GroupGenerationPrefix(options.group_name, generation);
      ASSIGN_OR_RETURN(std::unique_ptr<gpu::GrpcRendezvousStore> store,
                       gpu::GrpcRendezvousStore::Create(so));
      if (options.backend == BackendKind::kCuda) {
        gpu::NcclCommunicatorOptions no;
        no.rank = options.model.tp_rank;
        no.size = options.model.tp_size;
        no.device = options.device;
        no.timeout = options.comm_timeout;
        absl::StatusOr<std::unique_ptr<gpu::Communicator>> nccl =
            gpu::CreateNcclCommunicator(no, *store);
        if (!nccl.ok()) {
          return absl::Status(nccl.status().code(),
                              absl::StrCat("joining the TP group (NCCL) at ",
                                           options.group_address, ": ",
                                           nccl.status().message()));
        }
        return std::unique_ptr<gpu::Communicator>(
            std::make_unique<BackendOrderedCommunicator>(*std::move(nccl),
                                                         backend));
      }
      gpu::GlooCommunicatorOptions co;
      co.rank = options.model.tp_rank;
      co.size = options.model.tp_size;
      co.hostname = options.comm_host;
      co.timeout = options.comm_timeout;
      absl::StatusOr<std::unique_ptr<gpu::GlooCommunicator>> comm =
          gpu::GlooCommunicator::Create(co, *store);
      if (!comm.ok()) {
        return absl::Status(
            comm.status().code(),
            absl::StrCat("joining the TP group at ", options.group_address,
                         ": ", comm.status().message()));
      }
      return std::unique_ptr<gpu::Communicator>(*std::move(comm));
    };
    ASSIGN_OR_RETURN(rt->comm_, gpu::GroupMembership::Create(
                                    mo.tp_rank, mo.tp_size, std::move(form)));
  }
  if (!options.engram_store.empty()) {
    engram::GrpcEngramClientOptions eo;
    eo.target = options.engram_store;
    eo.timeout = options.engram_timeout;
    ASSIGN_OR_RETURN(rt->engram_grpc_, engram::GrpcEngramClient::Create(eo));
  }
  if (!options.engram_shm_socket.empty()) {
    engram::ShmEngramClientOptions so;
    so.socket_path = options.engram_shm_socket;
    so.timeout = options.engram_timeout;
    so.fallback = rt->engram_grpc_.get();
    ASSIGN_OR_RETURN(rt->engram_shm_, engram::ShmEngramClient::Create(so));
  }
  engram::EngramClient* engram = rt->engram_shm_ != nullptr
                                     ? rt->engram_shm_.get()
                                     : rt->engram_grpc_.get();
  ASSIGN_OR_RETURN(rt->model_, model::Model::Create(mo, *rt->backend_,
                                                    rt->comm_.get(), engram));
  if (mo.max_speculative_tokens > 0) {
    model::DsparkOptions dso;
    dso.checkpoint_dir = mo.checkpoint_dir;
    dso.tp_rank = mo.tp_rank;
    dso.tp_size = mo.tp_size;
    const model::Model& m = *rt->model_;
    ASSIGN_OR_RETURN(rt->drafter_,
                     model::DsparkDrafter::Create(
                         dso, m.dims(), *rt->backend_, rt->comm_.get(),
                         m.embedding_head(), m.vocab()));
  }
  return rt;
}

}  // namespace mneme::worker
