#ifndef MNEME_FORMATS_UE8M0_H_
#define MNEME_FORMATS_UE8M0_H_

// UE8M0 (safetensors dtype F8_E8M0): an unsigned power-of-two scale, 8
// exponent bits, bias 127, no mantissa. Code e is 2^(e - 127); 255 is NaN.
//
// Code 0: readers disagree (some treat it as zero). Here it is 2^-127, the
// formula applied without exception (an fp32 subnormal, bits 0x00400000), so
// decoding never turns a scale into zero. FloatToUe8m0 only emits it for
// inputs <= 2^-127.

#include <bit>
#include <cstdint>

namespace mneme::formats {

// The fp32 value of a UE8M0 code (exact): 2^(code - 127), code 0 -> 2^-127,
// code 255 -> quiet NaN (bits 0x7FC00000, as E4m3ToFloat).
inline float Ue8m0ToFloat(uint8_t code) {
  const uint32_t bits = code == 255 ? 0x7FC00000u
                        : code == 0 ? 0x00400000u
                                    : static_cast<uint32_t>(code) << 23;
  return std::bit_cast<float>(bits);
}

// Rounds UP to a power of two: the code of the smallest 2^k >= `value`
// (the rounding scales need, so that nothing scaled by it grows). NaN -> 255;
// values <= 2^-127 (zero and negatives included) -> 0; values above 2^127
// (+inf included) saturate to 254 (2^127).
uint8_t FloatToUe8m0(float value);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_UE8M0_H_
