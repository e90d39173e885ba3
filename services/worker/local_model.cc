#include "services/worker/local_model.h"

#include <utility>

#include "common/status_macros.h"
#include "engram_store/client/in_process_engram_client.h"
#include "gpu/cpu/cpu_backend.h"

namespace mneme::worker {

LocalModel::~LocalModel() {
  // The model borrows the client and the backend; the client the store.
  model_.reset();
  client_.reset();
  store_.reset();
}

absl::StatusOr<std::unique_ptr<LocalModel>> LocalModel::Create(
    const LocalModelOptions& options) {
  std::unique_ptr<LocalModel> local(new LocalModel());
  if (options.make_backend) {
    ASSIGN_OR_RETURN(local->backend_, options.make_backend());
  } else {
    gpu::CpuBackendOptions backend_options;
    backend_options.threads = options.threads;
    backend_options.dequantize_weights = options.dequantize_weights;
    ASSIGN_OR_RETURN(local->backend_, gpu::CpuBackend::Create(backend_options));
  }

  model::ModelOptions model_options = options.model;
  model_options.checkpoint_dir = options.checkpoint_dir;
  model_options.tp_rank = 0;
  model_options.tp_size = 1;
  ASSIGN_OR_RETURN(
      std::unique_ptr<checkpoint::ModelConfig> config,
      checkpoint::ModelConfig::Create(options.checkpoint_dir + "/config.json"));
  if (config->Find("engram_layer_ids") != nullptr) {
    engram::EngramStoreOptions store_options;
    store_options.checkpoint_dir = options.checkpoint_dir;
    store_options.ram_cache_bytes = uint64_t{64} << 20;
    store_options.io_threads = 2;
    ASSIGN_OR_RETURN(local->store_, engram::EngramStore::Create(store_options));
    local->client_ = std::make_unique<engram::InProcessEngramClient>(
        local->store_.get(), engram::RequestLimits{});
  }
  ASSIGN_OR_RETURN(local->model_,
                   model::Model::Create(model_options, *local->backend_,
                                        nullptr, local->client_.get()));
  return local;
}

}  // namespace mneme::worker
