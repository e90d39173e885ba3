#include <cuda_runtime.h>

#include "gpu/cuda/self_test_kernel.h"

namespace mneme::gpu::cuda {
namespace {

__global__ void PatternKernel(uint32_t* out, int64_t n, uint32_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    out[i] = static_cast<uint32_t>(i) * 2654435761u + seed;
  }
}

}  // namespace

int LaunchPatternKernel(uint32_t* out, int64_t n, uint32_t seed) {
  constexpr int kThreads = 256;
  const int blocks =
      static_cast<int>(n / kThreads + 1 < 1024 ? n / kThreads + 1 : 1024);
  PatternKernel<<<blocks, kThreads>>>(out, n, seed);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mneme::gpu::cuda
