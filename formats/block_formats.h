#ifndef MNEME_FORMATS_BLOCK_FORMATS_H_
#define MNEME_FORMATS_BLOCK_FORMATS_H_

// The block-scaled weight formats of the checkpoints, as row-major
// [rows, cols] matrices, and their exact dequantization to fp32 (scalar).
//
//   FP8 block: one e4m3 code per value, one UE8M0 scale per block_rows x
//              block_cols block of the matrix (DeepSeek V4.1: 32 x 32);
//              [ceil(rows / block_rows), ceil(cols / block_cols)] scales,
//              row-major. value = e4m3(code) * 2^(scale - 127).
//   MXFP4:     e2m1 codes, two per byte (the even element in the low
//              nibble), one UE8M0 scale per 32 consecutive values of a row
//              ([rows, cols / 32] scales). value = e2m1(nibble) * 2^(s - 127).
//   NVFP4:     e2m1 codes packed as MXFP4, one e4m3 scale per 16 consecutive
//              values of a row ([rows, cols / 16] scales), times one fp32
//              global scale: value = (e2m1(nibble) * e4m3(s)) * global_scale,
//              evaluated in that order (the first product is exact), as the
//              Engram row decoders (row_decode.h) do.
//
// Each value is the exact product rounded once to fp32. NaN codes (e4m3
// 0x7F / 0xFF, UE8M0 255) decode to NaN; callers that must not see NaNs scan
// with the Find*Nan functions first. UE8M0 code 0 is 2^-127 (ue8m0.h).
//
// The functions trust their arguments (sizes as documented, cols a multiple
// of the group size); callers validate shapes. Thread-safe; no allocation.

#include <cstdint>

namespace mneme::formats {

// Values of a row that share one scale.
inline constexpr int64_t kMxfp4GroupSize = 32;
inline constexpr int64_t kNvfp4GroupSize = 16;

// Scale bytes of an FP8 block-scaled [rows, cols] matrix with blocks of
// block_rows x block_cols (all > 0).
int64_t Fp8BlockScaleBytes(int64_t rows, int64_t cols, int block_rows,
                           int block_cols);

// Data and scale bytes of an MXFP4 / NVFP4 [rows, cols] matrix (cols a
// multiple of the group size).
inline int64_t Fp4DataBytes(int64_t rows, int64_t cols) {
  return rows * cols / 2;
}
inline int64_t Mxfp4ScaleBytes(int64_t rows, int64_t cols) {
  return rows * (cols / kMxfp4GroupSize);
}
inline int64_t Nvfp4ScaleBytes(int64_t rows, int64_t cols) {
  return rows * (cols / kNvfp4GroupSize);
}

// Rows [begin, end) of an FP8 block-scaled matrix with `cols` columns as
// fp32: `codes` holds the whole matrix's e4m3 codes, `scales` its UE8M0 block
// scales; `out` is the whole [rows, cols] fp32 matrix, of which only rows
// [begin, end) are written.
void DequantizeFp8BlockRows(const uint8_t* codes, const uint8_t* scales,
                            int64_t cols, int block_rows, int block_cols,
                            int64_t begin, int64_t end, float* out);

// As DequantizeFp8BlockRows for an MXFP4 matrix (`packed`: the e2m1 pairs,
// `scales`: the UE8M0 group scales).
void DequantizeMxfp4Rows(const uint8_t* packed, const uint8_t* scales,
                         int64_t cols, int64_t begin, int64_t end, float* out);

// As DequantizeFp8BlockRows for an NVFP4 matrix (`packed`: the e2m1 pairs,
// `scales`: the e4m3 group scales).
void DequantizeNvfp4Rows(const uint8_t* packed, const uint8_t* scales,
                         float global_scale, int64_t cols, int64_t begin,
                         int64_t end, float* out);

// Rows [begin, end) of a bf16 matrix (little-endian 2-byte values) as fp32,
// into the whole [rows, cols] matrix `out`.
void Bf16RowsToFloat(const uint8_t* data, int64_t cols, int64_t begin,
                     int64_t end, float* out);

// The index of the first NaN code among `count` e4m3 codes / UE8M0 scales /
// little-endian bf16 values / little-endian fp32 values, or -1 when there is
// none.
int64_t FindE4m3Nan(const uint8_t* codes, int64_t count);
int64_t FindUe8m0Nan(const uint8_t* codes, int64_t count);
int64_t FindBf16Nan(const uint8_t* data, int64_t count);
int64_t FindF32Nan(const uint8_t* data, int64_t count);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_BLOCK_FORMATS_H_
