#ifndef MNEME_FORMATS_BLOCK_PACK_FP8_BLOCK_H_
#define MNEME_FORMATS_BLOCK_PACK_FP8_BLOCK_H_

// Encoding and scanning FP8 block-scaled data as the DeepSeek checkpoints
// store it (dequantization is block_formats.h's): e4m3 codes
// (e4m3.h) with one UE8M0 scale (ue8m0.h) per block, value = e4m3(code) x
// 2^(e - 127). Linear layers use square blocks of kFp8MatrixBlock x
// kFp8MatrixBlock values (the last block row / column may be partial; the
// scale tensor is [ceil(rows / 32), ceil(cols / 32)], row-major); Engram
// rows use blocks of 32 values along the row (row_format.h).
//
// All functions are pure and thread-safe.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace mneme::formats {

// Side of the square blocks that share one UE8M0 scale in FP8 matrices.
inline constexpr int64_t kFp8MatrixBlock = 32;

// Encodes the row-major fp32 matrix `values` of `cols` columns (rows =
// values.size() / cols) to e4m3 `codes` (same size), with one UE8M0 scale
// per 32 x 32 block from the block's amax: the smallest 2^k with
// amax / 2^k <= 448, values multiplied by 2^-k exactly and rounded to
// nearest e4m3. Appends the scales to *scales, row-major over the blocks.
void EncodeFp8BlockMatrix(absl::Span<const float> values, int64_t cols,
                          absl::Span<uint8_t> codes,
                          std::vector<uint8_t>* scales);

// Largest |value| of one FP8 Engram row (`weights`: 256 e4m3 codes;
// `scales`: 8 UE8M0 codes, one per 32 values). NaN when a code or a scale
// is NaN; +inf when a value is beyond fp32.
float Fp8RowAmax(absl::Span<const uint8_t> weights,
                 absl::Span<const uint8_t> scales);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_BLOCK_PACK_FP8_BLOCK_H_
