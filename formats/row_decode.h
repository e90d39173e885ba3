#ifndef MNEME_FORMATS_ROW_DECODE_H_
#define MNEME_FORMATS_ROW_DECODE_H_

// Decoding Engram rows (ENGRAM.md "Decoding") to fp32 or bf16.
//
//   FP8 row:   value[i] = e4m3(w[i]) * 2^(e[i / 32] - 127)
//              (UE8M0 e = 0 is 2^-127, e = 255 is NaN; see ue8m0.h)
//   NVFP4 row: value[i] = (e2m1(nibble i) * e4m3(s[i / 16])) * global_scale
//              nibble i is the low nibble of byte i / 2 for even i, the high
//              nibble for odd i. The products are fp32 and evaluated in that
//              order; the first is exact, so the value is the exact product
//              rounded once to fp32.
//   bf16 output is the fp32 value rounded once, to nearest even (bf16.h).
//
// NaN codes (e4m3 0x7F/0xFF, UE8M0 255) give the quiet NaN 0x7FC00000 in fp32
// (0x7FC0 in bf16). Values past the fp32 range (e.g. 448 * 2^127) are +-inf.
//
// Two implementations exist, a scalar reference and a Highway SIMD path
// compiled for every SIMD target of the architecture and picked at run time
// for the CPU; they return identical bits for every input, NaNs included.
//
// The values assume the default floating-point environment (round to
// nearest, no flush-to-zero); with FTZ/DAZ set by a caller, subnormal values
// flush to zero (alike in both implementations).
//
// All functions are thread-safe and allocate nothing. `out` must not overlap
// the input.
//
// Example, decoding 24 cached raw rows of a table to bf16:
//   RowDecodeOptions options{.format = RowFormat::kNvfp4,
//                            .global_scale = config.global_scales.at(layer)};
//   std::vector<uint16_t> values(24 * kRowDim);
//   absl::Status status =
//       DecodeRowsBf16(options, raw_rows, absl::MakeSpan(values));

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "formats/row_format.h"

namespace mneme::formats {

// Which implementation decodes.
enum class DecodeImpl {
  // SIMD when the CPU has a SIMD target, else scalar.
  kAuto = 0,
  // The scalar reference.
  kScalar = 1,
  // The Highway path, even on a CPU where Highway only has its fallback
  // target (EMU128 emulates vectors; SCALAR runs the scalar reference).
  kSimd = 2,
};

struct RowDecodeOptions {
  // Format of the rows. Must be kFp8 or kNvfp4. Default: kUnspecified
  // (rejected).
  RowFormat format = RowFormat::kUnspecified;
  // NVFP4 only: the table's fp32 global scale (engram_quant_global_scale of
  // the layer). Must be finite and >= 0. Ignored for kFp8. Default: 1.0.
  float global_scale = 1.0f;
  // Default: kAuto.
  DecodeImpl impl = DecodeImpl::kAuto;
};

// Decodes raw rows: N rows of RowBytes(options.format) bytes each, back to
// back, each its weight bytes immediately followed by its scale bytes (the
// layout the store caches). `out` receives N * kRowDim values, row-major.
// InvalidArgument if the format is unspecified, the global scale is invalid
// (NVFP4), rows.size() is not a multiple of RowBytes(format), or out.size()
// is not exactly N * kRowDim.
absl::Status DecodeRowsF32(const RowDecodeOptions& options,
                           absl::Span<const uint8_t> rows,
                           absl::Span<float> out);
absl::Status DecodeRowsBf16(const RowDecodeOptions& options,
                            absl::Span<const uint8_t> rows,
                            absl::Span<uint16_t> out);

// As above, with the weight bytes and the scale bytes of N rows in separate
// buffers, as the checkpoint's two tensors store them: `weights` holds N *
// RowWeightBytes(format) bytes, `scales` N * RowScaleBytes(format).
// InvalidArgument also if the two buffers disagree on N.
absl::Status DecodeRowsF32(const RowDecodeOptions& options,
                           absl::Span<const uint8_t> weights,
                           absl::Span<const uint8_t> scales,
                           absl::Span<float> out);
absl::Status DecodeRowsBf16(const RowDecodeOptions& options,
                            absl::Span<const uint8_t> weights,
                            absl::Span<const uint8_t> scales,
                            absl::Span<uint16_t> out);

// The Highway target the SIMD path runs on this CPU, e.g. "AVX2" or "NEON"
// (for logs and benchmark labels).
const char* DecodeSimdTargetName();

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_ROW_DECODE_H_
