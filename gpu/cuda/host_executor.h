#ifndef MNEME_GPU_CUDA_HOST_EXECUTOR_H_
#define MNEME_GPU_CUDA_HOST_EXECUTOR_H_

// The kernel backend's ops run on the host, one item after another: the CUDA
// backend's logic without a GPU (tests; not a serving backend - the CPU
// backend is).

#include <memory>

#include "gpu/cuda/executor.h"

namespace mneme::gpu {

std::unique_ptr<Executor> MakeHostExecutor();

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_HOST_EXECUTOR_H_
