#ifndef MNEME_FORMATS_BF16_H_
#define MNEME_FORMATS_BF16_H_

// bfloat16 carried as its raw bits in a uint16_t: the upper half of an fp32.

#include <bit>
#include <cstdint>

namespace mneme::formats {

// bf16 bits of `value`, rounded to nearest with ties to even. Overflow
// rounds to +-inf, subnormals round like normals (no flush to zero), and a
// NaN stays NaN with its sign and upper payload, made quiet (bit 6 set).
inline uint16_t FloatToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// The fp32 value of bf16 bits (exact).
inline float Bf16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_BF16_H_
