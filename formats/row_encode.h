#ifndef MNEME_FORMATS_ROW_ENCODE_H_
#define MNEME_FORMATS_ROW_ENCODE_H_

// Encoding one Engram row of kRowDim fp32 values, for the tools (synthetic
// checkpoints, FP8 -> NVFP4 conversion). Round-to-nearest encoders; the
// decoders are in row_decode.h.
//
// FP8 row (256 x e4m3 + 8 x UE8M0): each block of 32 values gets the
// smallest power-of-two scale 2^k with block_amax / 2^k <= 448, i.e. the
// smallest k with block_amax <= 448 * 2^k (evaluated exactly), clamped to
// k >= -127 (an all-zero block gets 2^-127, UE8M0 code 0); then each value
// is FloatToE4m3(x / 2^k). Values are not clipped: the block maximum maps to
// at most 448.
//
// NVFP4 row (128 packed bytes + 16 x e4m3 block scales), as QUANT.md's
// round-to-nearest ("amax") procedure: for each block of 16 values
//   scale = FloatToE4m3(block_amax / 6 / global_scale)   (fp32, that order)
//   code  = FloatToE2m1(x / (E4m3ToFloat(scale) * global_scale))
// and a block whose E4m3ToFloat(scale) * global_scale is 0 (scale underflow,
// or an all-zero block) gets code 0 for every value. Two codes per byte, the
// even element in the low nibble. A global scale much smaller than
// table_amax / (6 * 448) saturates block scales at 448 and clips values.
//
// All functions are thread-safe.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "formats/row_format.h"

namespace mneme::formats {

// Encodes `values` (kRowDim finite floats) into one FP8 row: `weights`
// receives kFp8WeightBytes e4m3 codes, `scales` kFp8ScaleBytes UE8M0 codes.
// InvalidArgument for a wrong span size or a NaN/infinite value.
absl::Status EncodeFp8Row(absl::Span<const float> values,
                          absl::Span<uint8_t> weights,
                          absl::Span<uint8_t> scales);

// As above into one raw row (RowBytes(kFp8) bytes: weights then scales).
absl::Status EncodeFp8Row(absl::Span<const float> values,
                          absl::Span<uint8_t> row);

// Encodes `values` (kRowDim finite floats) into one NVFP4 row for a table
// with `global_scale` (finite, > 0): `weights` receives kNvfp4WeightBytes
// packed e2m1 pairs, `scales` kNvfp4ScaleBytes e4m3 codes. InvalidArgument
// for a wrong span size, a NaN/infinite value or an invalid global scale.
absl::Status EncodeNvfp4Row(absl::Span<const float> values, float global_scale,
                            absl::Span<uint8_t> weights,
                            absl::Span<uint8_t> scales);

// As above into one raw row (RowBytes(kNvfp4) bytes: weights then scales).
absl::Status EncodeNvfp4Row(absl::Span<const float> values, float global_scale,
                            absl::Span<uint8_t> row);

// The NVFP4 global scale of a table whose largest |value| is `table_amax`:
// table_amax / (6 * 448) in fp32 (QUANT.md; 11.0 -> 0.004092), so that the
// largest block scale is 448. Returns 1.0 for table_amax == 0 (any positive
// scale encodes zeros). table_amax must be finite and >= 0.
float Nvfp4GlobalScale(float table_amax);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_ROW_ENCODE_H_
