// fp16 conversions against the compiler's _Float16 (IEEE binary16 with
// round-to-nearest-even conversions).

#include "formats/fp16.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace mneme::formats {
namespace {

uint16_t ReferenceBits(float value) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}

TEST(Fp16, EveryCodeDecodesExactly) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float value = Fp16ToFloat(static_cast<uint16_t>(bits));
    const float expected = static_cast<float>(
        std::bit_cast<_Float16>(static_cast<uint16_t>(bits)));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(value)) << bits;
      ASSERT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(value)))) << bits;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(value), std::bit_cast<uint32_t>(expected))
        << bits;
    ASSERT_EQ(FloatToFp16(value), bits) << bits;
  }
}

TEST(Fp16, RoundsToNearestEvenLikeTheCompiler) {
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    // fp32 values around the fp16 range, subnormals and overflow included.
    uint32_t bits = rng();
    const uint32_t exponent = 95 + rng() % 50;  // 2^-32 .. 2^17
    bits = (bits & 0x807FFFFFu) | (exponent << 23);
    const float value = std::bit_cast<float>(bits);
    ASSERT_EQ(FloatToFp16(value), ReferenceBits(value)) << value;
  }
  // Ties, halfway points in the subnormals, and the overflow boundary.
  for (const float value :
       {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f, 3 * 0x1p-25f,
        0x1.8p-25f, 65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e9f, -65520.0f,
        0.0f, -0.0f, std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(FloatToFp16(value), ReferenceBits(value)) << value;
  }
}

}  // namespace
}  // namespace mneme::formats
