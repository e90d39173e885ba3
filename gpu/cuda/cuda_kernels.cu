#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gpu/cuda/cuda_kernels.h"
#include "gpu/cuda/kernel_ops.h"

namespace mneme::gpu::cuda {
namespace {

constexpr int kThreads = 256;
// The warp kernels give a warp one item: all its lanes in one block.
static_assert(kThreads % 32 == 0);
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

// Linear with one warp per LinearOp item (a weight row for up to
// kLinearRowTokens tokens): the lanes read neighbouring columns of the row
// (coalesced), each decoded weight serves kTokens tokens of the item, then
// a shuffle reduction per token. An item of more tokens is taken kTokens at
// a time (the row read again), so kTokens only sizes the sums kept in
// registers: the launch picks it from the call's tokens (a decode GEMV of
// one token keeps one sum, not 16). Same decode as LinearOp
// (WeightView::At); the sums are taken in another order, the same for
// every kTokens.
//
// A weight that kernels::LinearSlices fits is read a slice (16 or 8 bytes)
// a lane at a time instead: its format is looked at once per item, and
// each slice is decoded by DecodeSlice into the same values At gives.

// The warp's sums of the lanes' sum[t] into outputs t < m of the item's
// tokens from t0 (shuffle-down tree; lane 0 writes).
template <int kTokens>
__device__ void StoreWarpSums(const kernels::LinearOp& op, int64_t item, int t0,
                              int m, int lane, float (&sum)[kTokens]) {
  float* y = op.y + (op.FirstToken(item) + t0) * op.w.rows + op.Row(item);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    if (t >= m) break;
    float s = sum[t];
    for (int offset = 16; offset > 0; offset >>= 1) {
      s += __shfl_down_sync(0xffffffffu, s, offset);
    }
    if (lane == 0) {
      float* out = y + t * op.w.rows;
      *out = op.accumulate ? *out + s : s;
    }
  }
}

template <kernels::Format F, int kTokens>
__device__ void LinearSliceItem(const kernels::LinearOp& op, int64_t item,
                                int lane) {
  const int n = op.ChunkTokens(item);
  for (int t0 = 0; t0 < n; t0 += kTokens) {
    const int m = n - t0 < kTokens ? n - t0 : kTokens;
    float sum[kTokens] = {};
    kernels::LinearSlices{op}.Partial<F, kTokens>(item, t0, m, lane, sum);
    StoreWarpSums<kTokens>(op, item, t0, m, lane, sum);
    if constexpr (kTokens >= kernels::kLinearRowTokens) break;
  }
}

template <int kTokens>
__device__ void LinearWarpItem(const kernels::LinearOp& op, int64_t item,
                               int lane) {
  if (kernels::LinearSlices::Fit(op)) {
    using kernels::Format;
    switch (op.w.format) {
      case Format::kF32:
        return LinearSliceItem<Format::kF32, kTokens>(op, item, lane);
      case Format::kBf16:
        return LinearSliceItem<Format::kBf16, kTokens>(op, item, lane);
      case Format::kFp8Block:
        return LinearSliceItem<Format::kFp8Block, kTokens>(op, item, lane);
      case Format::kMxfp4:
        return LinearSliceItem<Format::kMxfp4, kTokens>(op, item, lane);
      case Format::kNvfp4:
        return LinearSliceItem<Format::kNvfp4, kTokens>(op, item, lane);
      default:
        break;
    }
  }
  const int64_t r = op.Row(item);
  const int n = op.ChunkTokens(item);
  for (int t0 = 0; t0 < n; t0 += kTokens) {
    const float* x = op.x + (op.FirstToken(item) + t0) * op.w.cols;
    const int m = n - t0 < kTokens ? n - t0 : kTokens;
    float sum[kTokens] = {};
    for (int64_t c = lane; c < op.w.cols; c += 32) {
      const float wv = op.w.At(r, c);
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t < m) sum[t] += x[t * op.w.cols + c] * wv;
      }
    }
    StoreWarpSums<kTokens>(op, item, t0, m, lane, sum);
    // An item has at most kLinearRowTokens tokens: one pass.
    if constexpr (kTokens >= kernels::kLinearRowTokens) break;
  }
}

// The warps of the grid over `items`, grid-stride: item_fn(item, lane).
template <typename ItemFn>
__device__ void ForEachWarpItem(int64_t items, const ItemFn& item_fn) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t item =
           (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       item < items; item += warps) {
    item_fn(item, lane);
  }
}

template <int kTokens>
__global__ void LinearWarpKernel(kernels::LinearOp op, int64_t items) {
  ForEachWarpItem(items, [&](int64_t item, int lane) {
    LinearWarpItem<kTokens>(op, item, lane);
  });
}

// The routed experts' Linear: each warp finds its item's group, then works
// as LinearWarpKernel on that group's weight and tokens. The group's weight
// view comes from memory into registers (LinearWarpKernel reads its own
// from the kernel parameters): bounded to 2 blocks a multiprocessor, which
// nvcc meets for sm_90 and sm_121 without spilling (about 120 registers; at 3
// blocks it spills).
template <int kTokens>
__global__ void __launch_bounds__(kThreads, 2)
    GroupedLinearWarpKernel(kernels::GroupedLinearOp op, int64_t items) {
  ForEachWarpItem(items, [&](int64_t item, int lane) {
    const int64_t g = op.Group(item);
    if (op.groups[g].tokens == 0) return;  // past the last group's items
    LinearWarpItem<kTokens>(op.Args(g), item - op.groups[g].first_item, lane);
  });
}

// The sums a warp Linear keeps for calls of at most `tokens` tokens a
// weight row (more are right too, in passes).
int WarpTokens(int64_t tokens) {
  if (tokens <= 1) return 1;
  if (tokens <= 4) return 4;
  return kernels::kLinearRowTokens;
}

// One tile of a LinearTiledOp by the block: the op's phases with a barrier
// between them.
__device__ void LinearBlockTile(const kernels::LinearTiledOp& op, int64_t tile,
                                kernels::LinearTile& memory) {
  const int thread = static_cast<int>(threadIdx.x);
  kernels::LinearTileSums sums = {};
  for (int64_t c0 = 0; c0 < op.args.w.cols; c0 += kernels::kTileCols) {
    op.LoadTile(tile, c0, thread, memory);
    __syncthreads();
    op.AccumulateTile(thread, memory, sums);
    __syncthreads();
  }
  op.StoreTile(tile, thread, sums);
}

// Linear of many tokens: one block per tile (LinearTiledOp).
__global__ void __launch_bounds__(kernels::kTileThreads)
    LinearTiledKernel(kernels::LinearTiledOp op, int64_t tiles) {
  __shared__ kernels::LinearTile tile_memory;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    LinearBlockTile(op, tile, tile_memory);
  }
}

// The routed experts' Linear by tiles: each block finds its tile's group
// (the whole block the same one, so the barriers are uniform).
__global__ void __launch_bounds__(kernels::kTileThreads)
    GroupedLinearTiledKernel(kernels::GroupedLinearTiledOp op, int64_t tiles) {
  __shared__ kernels::LinearTile tile_memory;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t g = op.args.Group(tile);
    // Past the last group's tiles (the whole block alike).
    if (op.args.groups[g].tokens == 0) continue;
    LinearBlockTile(op.Tiled(g), tile - op.args.groups[g].first_item,
                    tile_memory);
  }
}

// Sparse attention by blocks of op.block_heads warps, a warp per (query,
// head) of one query (SparseAttentionBlockOp): each tile of listed keys is
// read into shared memory by the whole block between two barriers (every
// thread reaches them: a warp without a head loads too), then each warp
// runs SparseAttentionWarpOp's phases over the tile, the dot product
// summed by an xor butterfly (every lane gets the same sum, as
// ButterflySum).
__global__ void __launch_bounds__(kernels::kAttentionBlockThreads)
    SparseAttentionBlockKernel(kernels::SparseAttentionBlockOp op,
                               int64_t items) {
  __shared__ kernels::AttentionKeyTile tile;
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread & 31;
  for (int64_t b = blockIdx.x; b < items; b += gridDim.x) {
    const int64_t g = op.GroupItem(b);
    const int64_t item = op.Item(g, thread / 32);
    kernels::AttentionLane s;
    if (item >= 0) op.warp.Begin(item, lane, s);
    const int64_t end = op.EndKey(b);
    for (int64_t j0 = op.FirstKey(b); j0 < end;
         j0 += kernels::kAttentionTileKeys) {
      __syncthreads();  // the last tile is read by every warp
      op.LoadTile(g, j0, thread, tile);
      __syncthreads();
      if (item < 0) continue;
      for (int k = 0; k < kernels::kAttentionTileKeys; ++k) {
        if (tile.rows[k] < 0) continue;
        float dot = op.warp.PartialDotOf(tile.keys[k], lane, s);
        for (int offset = 16; offset > 0; offset >>= 1) {
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        op.warp.Step(dot, s);
      }
    }
    if (item >= 0) op.Finish(b, thread / 32, lane, s);
  }
}

// Hadamard transforms of blocks of 128: one warp per block (Hadamard128Op's
// lanes), the spans of 4 to 64 by shuffles.
__global__ void Hadamard128WarpKernel(kernels::Hadamard128Op op,
                                      int64_t items) {
  ForEachWarpItem(items, [&](int64_t item, int lane) {
    float v[kernels::kHadamardLaneValues];
    op.Load(item, lane, v);
#pragma unroll
    for (int h = kernels::kHadamardLaneValues; h < 128; h *= 2) {
#pragma unroll
      for (int i = 0; i < kernels::kHadamardLaneValues; ++i) {
        const float partner = __shfl_xor_sync(0xffffffffu, v[i],
                                              h / kernels::kHadamardLaneValues);
        v[i] = kernels::Hadamard128Op::Cross(v[i], partner, lane, h);
      }
    }
    op.Store(item, lane, v);
  });
}

// A row warp op (kernels::RowWarpRun's phases) with one warp per row: each
// lane's Partial, their xor-butterfly sum (as ButterflySum: v + the partner
// lane's v, member by member), each lane's Finish.
__device__ void AddPartner(float& v, int offset) {
  v += __shfl_xor_sync(0xffffffffu, v, offset);
}
__device__ void AddPartner(kernels::EngramGateOp::Sums& v, int offset) {
  AddPartner(v.dot, offset);
  AddPartner(v.xx, offset);
  AddPartner(v.kk, offset);
}
__device__ void AddPartner(kernels::SamplePickOp::Bins& v, int offset) {
#pragma unroll
  for (int d = 0; d < kernels::kSampleBins; ++d) {
    v.tokens[d] += __shfl_xor_sync(0xffffffffu, v.tokens[d], offset);
    v.weight[d] += __shfl_xor_sync(0xffffffffu, v.weight[d], offset);
  }
}
__device__ void AddPartner(kernels::TopKPickOp::Bins& v, int offset) {
#pragma unroll
  for (int d = 0; d < kernels::kTopKBins; ++d) {
    v.n[d] += __shfl_xor_sync(0xffffffffu, v.n[d], offset);
  }
}

template <typename Op>
__global__ void RowWarpKernel(Op op, int64_t items) {
  ForEachWarpItem(items, [&](int64_t item, int lane) {
    auto sum = op.Partial(item, lane);
    for (int offset = 16; offset > 0; offset >>= 1) AddPartner(sum, offset);
    op.Finish(item, lane, sum);
  });
}

// The router's choice with one warp per token (MoeRouteOp's phases): per
// expert chosen, each lane's best, then the better of two lanes' by an xor
// butterfly until every lane holds the best.
__global__ void MoeRouteWarpKernel(kernels::MoeRouteOp op, int64_t items) {
  ForEachWarpItem(items, [&](int64_t t, int lane) {
    kernels::MoeRouteOp::Pick prev;
    float sum = 0.0f;
    for (int32_t k = 0; k < op.top_k; ++k) {
      kernels::MoeRouteOp::Pick best = op.LaneBest(t, lane, prev);
      for (int offset = 16; offset > 0; offset >>= 1) {
        const kernels::MoeRouteOp::Pick other{
            .id = __shfl_xor_sync(0xffffffffu, best.id, offset),
            .value = __shfl_xor_sync(0xffffffffu, best.value, offset)};
        best = kernels::MoeRouteOp::Better(best, other);
      }
      prev = best;
      if (lane == 0) op.expert_ids[t * op.top_k + k] = best.id;
      sum += op.score[t * op.experts + best.id];
    }
    op.Finish(t, lane, sum);
  });
}

// The grouped layout of a MoE layer's experts with one warp per table
// (ExpertPlanOp's phases): per round of 32 experts each lane's counts, a
// shuffle-up scan (as WarpInclusiveScan), each lane's groups, and the
// round's total carried on; lane 0 writes the sentinels.
__device__ kernels::ExpertPlanOp::Counts ShflUp(
    const kernels::ExpertPlanOp::Counts& v, int offset) {
  return {.tokens = __shfl_up_sync(0xffffffffu, v.tokens, offset),
          .row_items = __shfl_up_sync(0xffffffffu, v.row_items, offset),
          .tile_items = __shfl_up_sync(0xffffffffu, v.tile_items, offset)};
}
__device__ kernels::ExpertPlanOp::Counts ShflIdx(
    const kernels::ExpertPlanOp::Counts& v, int lane) {
  return {.tokens = __shfl_sync(0xffffffffu, v.tokens, lane),
          .row_items = __shfl_sync(0xffffffffu, v.row_items, lane),
          .tile_items = __shfl_sync(0xffffffffu, v.tile_items, lane)};
}

__global__ void ExpertPlanWarpKernel(kernels::ExpertPlanOp op, int64_t items) {
  using Counts = kernels::ExpertPlanOp::Counts;
  ForEachWarpItem(items, [&](int64_t j, int lane) {
    Counts carry;
    for (int64_t e0 = 0; e0 < op.experts; e0 += 32) {
      const Counts mine = op.Of(j, e0 + lane);
      Counts inclusive = mine;
      for (int offset = 1; offset < 32; offset <<= 1) {
        const Counts other = ShflUp(inclusive, offset);
        if (lane >= offset) inclusive = inclusive + other;
      }
      if (e0 + lane < op.experts) {
        op.Place(j, e0 + lane, carry + (inclusive - mine), mine);
      }
      carry = carry + ShflIdx(inclusive, 31);
    }
    if (lane == 0) op.Place(j, op.experts, carry, Counts{});
  });
}

// The indexer's scores by tiles: one block per tile (IndexScoresTiledOp),
// the phases of the op with a barrier between them.
__global__ void __launch_bounds__(kernels::kScoreThreads)
    IndexScoresTiledKernel(kernels::IndexScoresTiledOp op, int64_t tiles) {
  __shared__ kernels::ScoreTile tile_memory;
  const int thread = static_cast<int>(threadIdx.x);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    op.LoadKeys(tile, thread, tile_memory);
    __syncthreads();
    op.ScoreHeads(tile, thread, tile_memory);
    __syncthreads();
    op.Reduce(tile, thread, tile_memory);
    __syncthreads();
  }
}

// Whether Op is a row warp op (kernels::RowWarpRun, tagged kRowWarp).
template <typename Op, typename = void>
struct IsRowWarp : std::false_type {};
template <typename Op>
struct IsRowWarp<Op, std::void_t<decltype(Op::kRowWarp)>>
    : std::bool_constant<Op::kRowWarp> {};

// One thread per item, or one warp per item for a row warp op.
template <typename Op>
int LaunchImpl(const Op& op, int64_t items, cudaStream_t stream) {
  if constexpr (IsRowWarp<Op>::value) {
    RowWarpKernel<<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  } else {
    ForEachKernel<<<Blocks(items), kThreads, 0, stream>>>(op, items);
  }
  return static_cast<int>(cudaGetLastError());
}

// Calls launch(std::integral_constant<int, N>()) with the N sums
// WarpTokens(tokens) picks.
template <typename Launch>
void WithWarpTokens(int64_t tokens, const Launch& launch) {
  switch (WarpTokens(tokens)) {
    case 1:
      launch(std::integral_constant<int, 1>());
      break;
    case 4:
      launch(std::integral_constant<int, 4>());
      break;
    default:
      launch(std::integral_constant<int, kernels::kLinearRowTokens>());
  }
}

int LaunchImpl(const kernels::LinearOp& op, int64_t items,
               cudaStream_t stream) {
  WithWarpTokens(op.tokens, [&](auto sums) {
    LinearWarpKernel<decltype(sums)::value>
        <<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  });
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::GroupedLinearOp& op, int64_t items,
               cudaStream_t stream) {
  WithWarpTokens(op.most_tokens, [&](auto sums) {
    GroupedLinearWarpKernel<decltype(sums)::value>
        <<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  });
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::Hadamard128Op& op, int64_t items,
               cudaStream_t stream) {
  Hadamard128WarpKernel<<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::MoeRouteOp& op, int64_t items,
               cudaStream_t stream) {
  MoeRouteWarpKernel<<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::ExpertPlanOp& op, int64_t items,
               cudaStream_t stream) {
  ExpertPlanWarpKernel<<<Blocks(items * 32), kThreads, 0, stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

// Kernels of one block per item (tile).
int TileBlocks(int64_t tiles) {
  return static_cast<int>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
}

int LaunchImpl(const kernels::SparseAttentionBlockOp& op, int64_t items,
               cudaStream_t stream) {
  SparseAttentionBlockKernel<<<TileBlocks(items), op.block_heads * 32, 0,
                               stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::IndexScoresTiledOp& op, int64_t items,
               cudaStream_t stream) {
  IndexScoresTiledKernel<<<TileBlocks(items), kernels::kScoreThreads, 0,
                           stream>>>(op, items);
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::LinearTiledOp& op, int64_t items,
               cudaStream_t stream) {
  LinearTiledKernel<<<TileBlocks(items), kernels::kTileThreads, 0, stream>>>(
      op, items);
  return static_cast<int>(cudaGetLastError());
}

int LaunchImpl(const kernels::GroupedLinearTiledOp& op, int64_t items,
               cudaStream_t stream) {
  GroupedLinearTiledKernel<<<TileBlocks(items), kernels::kTileThreads, 0,
                             stream>>>(op, items);
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

namespace {

__device__ int64_t GlobalNanoseconds() {
  uint64_t ns = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return static_cast<int64_t>(ns);
}

__global__ void GateKernel(const volatile uint64_t* flag, uint64_t target,
                           int64_t max_ns) {
  const int64_t start = GlobalNanoseconds();
  while (*flag < target && GlobalNanoseconds() - start < max_ns) {
    __nanosleep(100);
  }
}

}  // namespace

int LaunchGate(const volatile uint64_t* flag, uint64_t target, int64_t max_ns,
               void* stream) {
  (void)cudaGetLastError();
  GateKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(flag, target,
                                                             max_ns);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mneme::gpu::cuda
