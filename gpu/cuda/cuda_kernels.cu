#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda/cuda_kernels.h"
#include "gpu/cuda/kernel_ops.h"

namespace mneme::gpu::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

int Blocks(int64_t threads) {
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// One thread per item, grid-stride.
template <typename Op>
__global__ void ForEachKernel(Op op, int64_t items) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < items; i += stride) {
    op(i);
  }
}

// Linear with one warp per output: the lanes read consecutive columns of the
// weight row (coalesced), then a shuffle reduction. Same decode as
// LinearOp (WeightView::At); the sum is taken in another order.
__global__ void LinearWarpKernel(kernels::LinearOp op, int64_t items) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t item =
           (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       item < items; item += warps) {
    const int64_t t = item / op.w.rows;
    const int64_t r = item % op.w.rows;
    const float* xt = op.x + t * op.w.cols;
    float sum = 0.0f;
    for (int64_t c = lane; c < op.w.cols; c += 32) sum += xt[c] * op.w.At(r, c);
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) {
      float* out = op.y + t * op.w.rows + r;
      *out = op.accumulate ? *out + sum : sum;
    }
  }
}

template <typename Op>
int LaunchImpl(const Op& op, int64_t items, cudaStream_t stream) {
  ForEachKernel<<<Blocks(items), kThreads, 0, stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::LinearOp& op, int64_t items,
               cudaStream_t stream) {
  LinearWarpKernel<<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

#define MNEME_CUDA_LAUNCH_DEFINITION(Op)                             \
  int LaunchOp(const kernels::Op& op, int64_t items, void* stream) { \
    if (items <= 0) return 0;                                        \
    /* An earlier error, already reported, is not this launch's. */  \
    (void)cudaGetLastError();                                        \
    return LaunchImpl(op, items, static_cast<cudaStream_t>(stream)); \
  }
MNEME_KERNEL_OPS(MNEME_CUDA_LAUNCH_DEFINITION)
#undef MNEME_CUDA_LAUNCH_DEFINITION

}  // namespace mneme::gpu::cuda
