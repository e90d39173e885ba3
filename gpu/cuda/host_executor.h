#ifndef MNEME_GPU_CUDA_HOST_EXECUTOR_H_
#define MNEME_GPU_CUDA_HOST_EXECUTOR_H_

// The kernel backend's ops run on the host, one item after another: the CUDA
// backend's logic without a GPU (tests; not a serving backend - the CPU
// backend is).

#include <memory>

#include "gpu/cuda/executor.h"

namespace mneme::gpu {

struct HostExecutorOptions {
  // Whether it plays a device that reads pinned memory in place
  // (Executor::ReadsPinnedInPlace: a GPU sharing the host's memory) rather
  // than one whose staged copies land at AwaitStaged.
  bool reads_pinned_in_place = false;
};

std::unique_ptr<Executor> MakeHostExecutor(HostExecutorOptions options = {});

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_HOST_EXECUTOR_H_
