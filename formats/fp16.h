#ifndef MNEME_FORMATS_FP16_H_
#define MNEME_FORMATS_FP16_H_

// IEEE binary16 (fp16) carried as its raw bits in a uint16_t: 1 sign bit,
// 5 exponent bits (bias 15), 10 mantissa bits; subnormals m * 2^-24.

#include <bit>
#include <cstdint>

namespace mneme::formats {

// The fp32 value of fp16 bits (exact; infinities and NaNs kept, NaN payload
// shifted into the upper fp32 mantissa bits).
inline float Fp16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1Fu) {
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    // mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) |
                              (mantissa << 13));
}

// fp16 bits of `value`, rounded to nearest with ties to even (the rounding
// of the CUDA __float2half_rn and of every fp16 arithmetic result).
// Magnitudes that round past 65504 become +-inf, subnormals are rounded (no
// flush to zero), a NaN stays a quiet NaN with its sign.
inline uint16_t FloatToFp16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  if (magnitude >= 0x47800000u) {  // >= 65536: inf (65520 rounds up below).
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (magnitude < 0x38800000u) {  // Below 2^-14: an fp16 subnormal or zero.
    // The value in units of 2^-24, rounded to nearest even; 1024 becomes the
    // smallest normal, as the bit layout continues.
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) {  // Below 2^-25: rounds to zero.
      return static_cast<uint16_t>(sign);
    }
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24 for exponent 102..112.
    const uint32_t truncated = significand >> shift;
    const uint32_t remainder = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    const uint32_t rounded =
        truncated +
        ((remainder > half || (remainder == half && (truncated & 1u))) ? 1u
                                                                       : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits;
  // a carry out of the mantissa moves to the exponent (and to inf past the
  // largest finite value), as the encoding is monotonic.
  const uint32_t rebased = magnitude - ((127u - 15u) << 23);
  const uint32_t rounded = (rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | rounded);
}

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_FP16_H_
