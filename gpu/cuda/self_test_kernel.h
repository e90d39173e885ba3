#ifndef MNEME_GPU_CUDA_SELF_TEST_KERNEL_H_
#define MNEME_GPU_CUDA_SELF_TEST_KERNEL_H_

#include <cstdint>

namespace mneme::gpu::cuda {

// Enqueues a kernel writing out[i] = i * 2654435761 + seed for i < n on the
// current device's default stream. Returns the launch's cudaError_t as int.
int LaunchPatternKernel(uint32_t* out, int64_t n, uint32_t seed);

}  // namespace mneme::gpu::cuda

#endif  // MNEME_GPU_CUDA_SELF_TEST_KERNEL_H_
