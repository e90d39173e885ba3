// CreateCudaBackend in a build without --config=cuda.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"

namespace mneme::gpu {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index must be >= 0, got ", device));
  }
  return absl::UnavailableError(
      "this build has no CUDA backend: build with --config=cuda");
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    int device, std::shared_ptr<KernelTimer>* timer) {
  if (timer == nullptr) {
    return absl::InvalidArgumentError("CreateCudaBackend: no timer to set");
  }
  return CreateCudaBackend(device);
}

}  // namespace mneme::gpu
