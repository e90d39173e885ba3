#ifndef MNEME_FORMATS_E2M1_H_
#define MNEME_FORMATS_E2M1_H_

// fp4 e2m1 (the NVFP4 element type): a 4-bit code, bit 3 the sign, bits 0-2 a
// magnitude from {0, 0.5, 1, 1.5, 2, 3, 4, 6}. No NaN, no infinity. NVFP4
// rows pack two codes per byte, the even element in the low nibble.

#include <array>
#include <cstdint>

namespace mneme::formats {

// Largest e2m1 magnitude.
inline constexpr float kE2m1Max = 6.0f;

namespace e2m1_internal {

inline constexpr std::array<float, 16> kE2m1ToFloat = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace e2m1_internal

// The value of the e2m1 code in the low 4 bits of `code` (upper bits are
// ignored). 0x8 is -0.0.
inline float E2m1ToFloat(uint8_t code) {
  return e2m1_internal::kE2m1ToFloat[code & 0xFu];
}

// The e2m1 code (0..15) nearest to `value`, ties to the even code, so the
// midpoints decode to 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
// 3.5 -> 4 and 5 -> 4. Magnitudes
// beyond 6 and infinities saturate to +-6; the sign is kept, also for results
// that round to zero (-0.1 -> 0x8); NaN -> 0 (e2m1 has no NaN).
uint8_t FloatToE2m1(float value);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_E2M1_H_
