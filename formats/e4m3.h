#ifndef MNEME_FORMATS_E4M3_H_
#define MNEME_FORMATS_E4M3_H_

// fp8 e4m3, the "fn" variant (OCP FP8 E4M3 as used by the DeepSeek
// checkpoints and by NVFP4 block scales): 1 sign bit, 4 exponent bits
// (bias 7), 3 mantissa bits. No infinities: 0x7F and 0xFF are NaN; the largest
// finite magnitude is 448 (0x7E); subnormals are m * 2^-9 for exponent 0.

#include <array>
#include <bit>
#include <cstdint>

namespace mneme::formats {

// Largest finite e4m3 magnitude.
inline constexpr float kE4m3Max = 448.0f;

namespace e4m3_internal {

// fp32 bit patterns of the 256 e4m3 codes (NaN codes map to 0x7FC00000).
constexpr std::array<uint32_t, 256> MakeE4m3ToFloatBits() {
  std::array<uint32_t, 256> bits{};
  for (uint32_t code = 0; code < 256; ++code) {
    const uint32_t sign = (code & 0x80u) << 24;
    const uint32_t exponent = (code >> 3) & 0xFu;
    const uint32_t mantissa = code & 0x7u;
    if ((code & 0x7Fu) == 0x7Fu) {
      bits[code] = 0x7FC00000u;
    } else if (exponent == 0) {
      // mantissa * 2^-9, exact in fp32.
      bits[code] = sign | std::bit_cast<uint32_t>(static_cast<float>(mantissa) *
                                                  0x1p-9f);
    } else {
      bits[code] = sign | ((exponent + 127 - 7) << 23) | (mantissa << 20);
    }
  }
  return bits;
}

inline constexpr std::array<uint32_t, 256> kE4m3ToFloatBits =
    MakeE4m3ToFloatBits();

}  // namespace e4m3_internal

// The fp32 value of an e4m3 code (exact). Both NaN codes (0x7F, 0xFF) decode
// to the same positive quiet NaN (bits 0x7FC00000), so every decoder in this
// package produces NaNs with identical bits.
inline float E4m3ToFloat(uint8_t code) {
  return std::bit_cast<float>(e4m3_internal::kE4m3ToFloatBits[code]);
}

// The e4m3 code nearest to `value`, ties to even. Finite magnitudes beyond
// 448 and infinities saturate to +-448 (0x7E / 0xFE); NaN gives 0x7F. The
// sign is kept, also for results that round to zero (-1e-9 -> 0x80, -0).
uint8_t FloatToE4m3(float value);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_E4M3_H_
