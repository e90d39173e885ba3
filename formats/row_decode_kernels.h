#ifndef MNEME_FORMATS_ROW_DECODE_KERNELS_H_
#define MNEME_FORMATS_ROW_DECODE_KERNELS_H_

// Internal to formats/: the decode loops behind row_decode.h,
// which validates arguments. Callers use row_decode.h.
//
// Every pair (scalar, SIMD) returns identical bits for identical input:
//  - FP8:   out = E4m3ToFloat(w) * Ue8m0ToFloat(e)               (one fp32 mul)
//  - NVFP4: out = (E2m1ToFloat(n) * E4m3ToFloat(s)) * global_scale
//    The first product is exact (at most 6 significant bits), so the value is
//    the exact product rounded once to fp32.
//  - bf16 outputs are FloatToBf16 of the fp32 result.
// Both paths decode NaN codes to the same quiet NaN (0x7FC00000) and never
// multiply two NaNs with different bits, so NaN bits agree as well.

#include <cstddef>
#include <cstdint>

// Reassociating or contracting the products would break the bit equality.
#ifdef __FAST_MATH__
#error "formats/ decoders need IEEE semantics: no -ffast-math"
#endif

namespace mneme::formats::row_decode_internal {

// Encoded rows as the kernels read them: row r's weight bytes begin at
// weights + r * weight_stride and its scale bytes at scales + r * scale_stride.
// Contiguous raw rows use stride RowBytes(format) for both, with
// scales = weights + RowWeightBytes(format).
struct EncodedRows {
  const uint8_t* weights = nullptr;
  size_t weight_stride = 0;
  const uint8_t* scales = nullptr;
  size_t scale_stride = 0;
  size_t num_rows = 0;
};

// Scalar reference. `out` holds num_rows * kRowDim values. For NVFP4,
// global_scale is finite and >= 0 (checked by the caller).
void DecodeFp8ToF32Scalar(const EncodedRows& rows, float* out);
void DecodeFp8ToBf16Scalar(const EncodedRows& rows, uint16_t* out);
void DecodeNvfp4ToF32Scalar(const EncodedRows& rows, float global_scale,
                            float* out);
void DecodeNvfp4ToBf16Scalar(const EncodedRows& rows, float global_scale,
                             uint16_t* out);

// Highway SIMD, dispatched to the best target this CPU supports.
void DecodeFp8ToF32Simd(const EncodedRows& rows, float* out);
void DecodeFp8ToBf16Simd(const EncodedRows& rows, uint16_t* out);
void DecodeNvfp4ToF32Simd(const EncodedRows& rows, float global_scale,
                          float* out);
void DecodeNvfp4ToBf16Simd(const EncodedRows& rows, float global_scale,
                           uint16_t* out);

// The Highway target the Simd functions dispatch to now, e.g. "AVX2".
const char* SimdTargetName();

// False when that target is an emulation without vector instructions
// (Highway's EMU128 or SCALAR), where the scalar loops are as fast or faster.
bool SimdTargetIsVectorized();

}  // namespace mneme::formats::row_decode_internal

#endif  // MNEME_FORMATS_ROW_DECODE_KERNELS_H_
