#include "formats/ue8m0.h"

#include <bit>
#include <cstdint>

namespace mneme::formats {

uint8_t FloatToUe8m0(float value) {
  if (value != value) return 255;
  if (value <= 0x1p-127f) return 0;
  if (value > 0x1p127f) return 254;
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t exponent = bits >> 23;  // value > 0: no sign bit
  if (exponent == 0) return 1;           // fp32 subnormal in (2^-127, 2^-126)
  const uint32_t mantissa = bits & 0x7FFFFFu;
  // value = 1.m * 2^(exponent - 127): exact power when m == 0, else round up.
  return static_cast<uint8_t>(exponent + (mantissa != 0 ? 1u : 0u));
}

}  // namespace mneme::formats
