#ifndef MNEME_GPU_CUDA_CUDA_BACKEND_H_
#define MNEME_GPU_CUDA_CUDA_BACKEND_H_

// The CUDA backend: the kernel backend (kernel_backend.h) on one device's
// stream.

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::gpu {

// The CUDA backend of device `device` (its index among the visible
// devices). Unavailable in a build without --config=cuda or when the device
// is not there; InvalidArgument for a negative index.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_CUDA_BACKEND_H_
