#ifndef MNEME_GPU_CUDA_CUDA_KERNELS_H_
#define MNEME_GPU_CUDA_CUDA_KERNELS_H_

// Launches of the ops (kernel_ops.h) on a CUDA stream; compiled by nvcc
// (cuda_kernels.cu) under --config=cuda only. Plain C++ so that host code
// includes it without the CUDA headers.

#include <cstdint>

#include "gpu/cuda/kernel_ops.h"

namespace mneme::gpu::cuda {

// Queues op(i) for every i < items on `stream` (a cudaStream_t) of the
// current device. Returns the launch's cudaError_t as an int (0 = queued).
#define MNEME_CUDA_LAUNCH_DECLARATION(Op) \
  int LaunchOp(const kernels::Op& op, int64_t items, void* stream);
MNEME_KERNEL_OPS(MNEME_CUDA_LAUNCH_DECLARATION)
#undef MNEME_CUDA_LAUNCH_DECLARATION

// Queues a one-thread kernel on `stream` that waits until *flag >= target
// or `max_ns` nanoseconds of device time have passed; `flag` is the device
// address of mapped pinned host memory that the host raises. The kernel
// timer holds the stream with it until a launch is queued behind, so that
// the launch's start event is not recorded before the host has queued the
// launch. Returns the launch's cudaError_t as an int.
int LaunchGate(const volatile uint64_t* flag, uint64_t target, int64_t max_ns,
               void* stream);

}  // namespace mneme::gpu::cuda

#endif  // MNEME_GPU_CUDA_CUDA_KERNELS_H_
