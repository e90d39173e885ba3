#include "formats/e4m3.h"

#include <bit>
#include <cstdint>

namespace mneme::formats {
namespace {

// `value >> shift`, rounded to nearest with ties to even.
uint32_t ShiftRightRoundEven(uint32_t value, uint32_t shift) {
  if (shift >= 32) return 0;
  if (shift == 0) return value;
  const uint32_t quotient = value >> shift;
  const uint32_t remainder = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const bool round_up =
      remainder > half || (remainder == half && (quotient & 1u) != 0);
  return quotient + (round_up ? 1u : 0u);
}

}  // namespace

uint8_t FloatToE4m3(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7F;  // NaN
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t exponent = magnitude >> 23;
  uint32_t code;
  if (exponent >= 127 - 6) {
    // |value| >= 2^-6, the smallest normal e4m3: round the 23-bit fp32
    // mantissa to 3 bits (a carry bumps the exponent), then rebias 127 -> 7.
    const uint32_t rounded =
        (magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20;
    code = rounded - ((127 - 7) << 3);
    if (code > 0x7E) code = 0x7E;  // saturate; 0x7F would be NaN
  } else if (exponent == 0) {
    code = 0;  // fp32 subnormal (or zero): far below 2^-10
  } else {
    // Subnormal e4m3: code = round(|value| * 2^9). |value| = significand *
    // 2^(exponent - 150) with the implicit bit, so shift by 141 - exponent.
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    code = ShiftRightRoundEven(significand, 141 - exponent);
    // code == 8 is 2^-6, the smallest normal: the encoding carries over.
  }
  return static_cast<uint8_t>(sign | code);
}

}  // namespace mneme::formats
