#ifndef MNEME_FORMATS_BLOCK_PACK_FP4_PACK_H_
#define MNEME_FORMATS_BLOCK_PACK_FP4_PACK_H_

// The element layout shared by the 4-bit block formats (MXFP4: one UE8M0
// scale per 32 values; NVFP4: one e4m3 scale per 16 values and an fp32
// tensor scale): e2m1 codes packed two per byte, the even element in the
// low nibble (e2m1.h). Also the scale codes the MXFP4 -> NVFP4 cast needs:
// the e4m3 code of a power of two and the exponent of a UE8M0 code.
//
// All functions are pure and thread-safe.

#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/types/span.h"

namespace mneme::formats {

// The UE8M0 code that is NaN.
inline constexpr uint8_t kUe8m0Nan = 255;

// The exponent k of UE8M0 `code` (2^k), code - 127; meaningless for
// kUe8m0Nan.
inline int Ue8m0Exponent(uint8_t code) { return static_cast<int>(code) - 127; }

// The e2m1 code in the low nibble of `byte` (the even element).
inline uint8_t LowE2m1(uint8_t byte) { return byte & 0xFu; }

// The e2m1 code in the high nibble of `byte` (the odd element).
inline uint8_t HighE2m1(uint8_t byte) { return byte >> 4; }

// The e2m1 code of element `half` (0: even, low nibble; 1: odd, high) of
// `byte`.
inline uint8_t E2m1OfPair(uint8_t byte, int half) {
  return (byte >> (4 * half)) & 0xFu;
}

// One byte holding `even` in the low nibble and `odd` in the high one (the
// upper bits of `even` must be clear; `odd` is shifted).
inline uint8_t PackE2m1Pair(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>(even | (odd << 4));
}

// Packs codes.size() e2m1 codes (one per byte, low 4 bits used; an even
// count) into codes.size() / 2 bytes of `packed`, the even element in the
// low nibble. Sizes are the caller's contract (checked in debug builds).
void PackE2m1Codes(absl::Span<const uint8_t> codes, absl::Span<uint8_t> packed);

// FloatToE2m1 (e2m1.h) without branches, for inner loops: the magnitude
// code is the number of rounding thresholds |value| passes, ">" where the
// lower neighbour is even and ">=" where it is odd, which is FloatToE2m1's
// ties-to-even; NaN passes none and gives 0 like it. Bit-identical to
// FloatToE2m1 for every input.
inline uint8_t FastFloatToE2m1(float value) {
  const float m = value < 0.0f ? -value : value;
  const int code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) +
                   (m > 2.5f) + (m >= 3.5f) + (m > 5.0f);
  return static_cast<uint8_t>(code | (value < 0.0f ? 0x8 : 0x0) |
                              (value == 0.0f && std::signbit(value) ? 0x8 : 0));
}

// The e4m3 code of 2^p for p in [-9, 8] (2^-9 .. 2^-7 are subnormals);
// nullopt outside.
std::optional<uint8_t> E4m3PowerOfTwo(int p);

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_BLOCK_PACK_FP4_PACK_H_
