#ifndef MNEME_SERVICES_WORKER_LOCAL_MODEL_H_
#define MNEME_SERVICES_WORKER_LOCAL_MODEL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engram_store/client/engram_client.h"
#include "engram_store/engram_store.h"
#include "gpu/backend.h"
#include "model/model.h"

namespace mneme::worker {

struct LocalModelOptions {
  // Checkpoint directory. Required.
  std::string checkpoint_dir;
  // CPU backend threads; 0 = all cores. Default: 0.
  int threads = 0;
  // CpuBackendOptions.dequantize_weights: fp32 copies of every weight (the
  // yardstick of the packed kernels). Default: false.
  bool dequantize_weights = false;
  // Makes the backend in place of the CPU backend (threads and
  // dequantize_weights then unused), e.g. gpu/cuda's CreateCudaBackend.
  // Default: empty (the CPU backend).
  std::function<absl::StatusOr<std::unique_ptr<gpu::Backend>>()> make_backend;
  // The model's cache and step limits. Default: ModelOptions{} (TP 1).
  model::ModelOptions model;
};

// A whole model in one process (TP 1): a backend (the CPU's unless
// options.make_backend says otherwise), an engram store over
// the checkpoint's tables with an in-process client, and the model. The
// reference ("oracle") run that distributed runs are checked against, and
// what `mneme run` and `mneme score` use. Thread-compatible.
class LocalModel {
 public:
  static absl::StatusOr<std::unique_ptr<LocalModel>> Create(
      const LocalModelOptions& options);
  ~LocalModel();

  model::Model& model() { return *model_; }
  gpu::Backend& backend() { return *backend_; }

 private:
  LocalModel() = default;

  std::unique_ptr<gpu::Backend> backend_;
  std::unique_ptr<engram::EngramStore> store_;
  std::unique_ptr<engram::EngramClient> client_;
  std::unique_ptr<model::Model> model_;
};

}  // namespace mneme::worker

#endif  // MNEME_SERVICES_WORKER_LOCAL_MODEL_H_
