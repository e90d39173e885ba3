#ifndef MNEME_GPU_CPU_QUANT_KERNELS_H_
#define MNEME_GPU_CPU_QUANT_KERNELS_H_

// Internal to gpu/cpu: matrix-vector products on weights kept in their
// checkpoint formats (bf16, FP8 block-scaled, MXFP4, NVFP4; backend.h's
// WeightFormat), so the CPU backend holds a weight in as many bytes as the
// checkpoint does and a decode step reads each weight byte once. Highway
// kernels compiled for every SIMD target, dispatched at run time to the best
// one the CPU supports.
//
// The kernels decode a row a tile at a time into a small buffer that stays in
// L1 and take the dot products of every token with it there: the values are
// exactly those of formats/block_formats.h's dequantization (each the exact
// product rounded once to fp32; NVFP4 as (e2m1 * scale) * global_scale), and
// the products are summed in fp32 in several vector accumulators, so a dot
// product differs from a sequential fp32 loop over the dequantized matrix by
// rounding only.
//
// The functions trust their arguments: the matrix passed
// gpu/host_weight.h's ValidateHostWeight (no NaN codes or scales), pointers
// are valid for the documented sizes, and a bf16 matrix's data is 2-byte
// aligned (it is read as uint16_t). Thread-safe (no state).

#include <cstdint>

#include "gpu/backend.h"

namespace mneme::gpu::quant_kernels {

// A weight matrix [rows, cols] in its checkpoint format (borrowed bytes, laid
// out as backend.h's HostWeight documents).
struct PackedMatrix {
  WeightFormat format = WeightFormat::kUnspecified;  // not kF32
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  int block_rows = 0;         // kFp8Block
  int block_cols = 0;         // kFp8Block
  float global_scale = 1.0f;  // kNvfp4
  // kExl3: bits per weight and codebook (scale = suh then svh, fp16).
  int exl3_bits = 0;
  formats::exl3::Codebook exl3_codebook = formats::exl3::Codebook::kMul1;
  // kGridbook: the scheme and its tables (scale = the fp32 row scales of an
  // fp8 scheme). The tables are owned by the weight.
  formats::gridbook::Scheme gridbook_scheme = {};
  const formats::gridbook::Codebooks* gridbook_books = nullptr;
  // kGridbook W4A4 input_global_scale; 0 = weight-only.
  float gridbook_input_scale = 0.0f;
};

// The functions below take bf16, kFp8Block, kMxfp4 and kNvfp4 matrices;
// codebook_kernels.h has the codebook formats (kExl3, kGridbook).

// For rows r in [row_begin, row_end) and tokens t < tokens:
//   y[t * ldy + r] = sum_c x[t * w.cols + c] * W[r, c]   (+= with accumulate)
// One token: each row decoded into registers and multiplied there (the fp4
// formats take the token's even and odd columns apart first, into a
// thread-local buffer). More: each row decoded once per 16 tokens, a tile at a
// time.
void DotRows(const PackedMatrix& w, const float* x, int64_t tokens,
             int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
             bool accumulate);

// Rows [begin, end) of w as fp32, row-major into out (which holds
// (end - begin) * w.cols floats): formats/block_formats.h's values, bit for
// bit.
void DecodeRows(const PackedMatrix& w, int64_t begin, int64_t end, float* out);

// The Highway target the functions dispatch to, e.g. "AVX2".
const char* SimdTargetName();

}  // namespace mneme::gpu::quant_kernels

#endif  // MNEME_GPU_CPU_QUANT_KERNELS_H_
