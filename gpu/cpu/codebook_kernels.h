#ifndef MNEME_GPU_CPU_CODEBOOK_KERNELS_H_
#define MNEME_GPU_CPU_CODEBOOK_KERNELS_H_

// Internal to gpu/cpu: products and decoding of weights kept in the codebook
// formats (backend.h's kExl3 and kGridbook), decoded a tile (EXL3: 16 x 16)
// or a superblock (GridBook: 256 values of a row) at a time into a buffer on
// the stack, so a weight stays in its checkpoint bytes in memory.
//
// EXL3 follows exllamav3's kernel route, y = had(had(x * suh) What) * svh:
// the input transform once per product (Exl3TransformInput), then 128 output
// features at a time (the Hadamard block of the outputs). GridBook rows are
// independent (row scales or in-superblock group scales).
//
// Values are those of formats/exl3 and formats/gridbook (their Highway
// decoders); products are summed in fp32 on Highway vectors (every target,
// dynamic dispatch), so results differ from a product with the dequantized
// fp32 matrix by rounding only. The functions trust their arguments (the
// weight passed ValidateHostWeight). Thread-safe (no state).

#include <cstdint>

#include "gpu/cpu/quant_kernels.h"

namespace mneme::gpu::codebook_kernels {

using quant_kernels::PackedMatrix;

// GridBook: for rows r in [row_begin, row_end) and tokens t < tokens,
//   y[t * ldy + r] = sum_c x[t * w.cols + c] * W[r, c]   (+= with accumulate)
void GridbookDotRows(const PackedMatrix& w, const float* x, int64_t tokens,
                     int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
                     bool accumulate);

// GridBook rows [begin, end) as fp32 into out ((end - begin) * w.cols).
void GridbookDecodeRows(const PackedMatrix& w, int64_t begin, int64_t end,
                        float* out);

// EXL3: xh = had128 of x[t] * suh for t < tokens, written in the order the
// tiles are read: xp[2 t w.cols + 32 tk + m] = xh[16 tk + row(m)], where
// row(m) is the tile row of stream positions j with j % 32 = m. `xp` holds
// 2 * tokens * w.cols values.
void Exl3TransformInput(const PackedMatrix& w, const float* x, int64_t tokens,
                        float* xp);

// EXL3: for output blocks b in [block_begin, block_end) (128 features each)
// and tokens t < tokens, y[t * ldy + o] (+)= (x W)[t, o] for the block's
// outputs o, from xp = Exl3TransformInput(x). tokens <= 16.
void Exl3OutputBlocks(const PackedMatrix& w, const float* xp, int64_t tokens,
                      int64_t block_begin, int64_t block_end, float* y,
                      int64_t ldy, bool accumulate);

// EXL3 rows [begin, end) of W (output features; multiples of 128) as fp32
// into out ((end - begin) * w.cols).
void Exl3DecodeRows(const PackedMatrix& w, int64_t begin, int64_t end,
                    float* out);

// The Highway target the kernels dispatch to now, e.g. "AVX2".
const char* SimdTargetName();

// The most tokens Exl3OutputBlocks takes.
inline constexpr int64_t kMaxExl3Tokens = 16;

}  // namespace mneme::gpu::codebook_kernels

#endif  // MNEME_GPU_CPU_CODEBOOK_KERNELS_H_
