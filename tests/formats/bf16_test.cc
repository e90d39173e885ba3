#include "formats/bf16.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace mneme::formats {
namespace {

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(Bf16Test, ToFloatIsTheUpperHalf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    EXPECT_EQ(std::bit_cast<uint32_t>(Bf16ToFloat(static_cast<uint16_t>(bits))),
              bits << 16);
  }
}

TEST(Bf16Test, EveryNonNanBf16RoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7FFF) > 0x7F80) continue;  // NaN
    EXPECT_EQ(FloatToBf16(FromBits(bits << 16)), bits) << bits;
  }
}

TEST(Bf16Test, TiesRoundToEven) {
  // 1 + 2^-8 lies halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81).
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(FloatToBf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3F81);
  // 1 + 3 * 2^-8 lies halfway between 0x3F81 (odd) and 0x3F82.
  EXPECT_EQ(FloatToBf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(FloatToBf16(std::nextafter(1.0f + 3 * 0x1p-8f, 0.0f)), 0x3F81);
  EXPECT_EQ(FloatToBf16(-(1.0f + 0x1p-8f)), 0xBF80);
  EXPECT_EQ(FloatToBf16(-(1.0f + 3 * 0x1p-8f)), 0xBF82);
}

TEST(Bf16Test, OverflowRoundsToInfinity) {
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7F7FFFu)), 0x7F7F);  // below the midpoint
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7F8000u)), 0x7F80);  // tie, odd -> inf
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
}

TEST(Bf16Test, NanStaysQuietNan) {
  EXPECT_EQ(FloatToBf16(FromBits(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(FloatToBf16(FromBits(0xFFC00000u)), 0xFFC0);
  // Payload only in the low half: truncation would give inf; stays NaN.
  EXPECT_EQ(FloatToBf16(FromBits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(FloatToBf16(FromBits(0xFF800001u)), 0xFFC0);
  // A signalling NaN with upper payload keeps it, made quiet.
  EXPECT_EQ(FloatToBf16(FromBits(0x7FA00000u)), 0x7FE0);
  // Rounding must not carry a NaN's payload into the sign.
  EXPECT_EQ(FloatToBf16(FromBits(0x7FFFFFFFu)), 0x7FFF);
}

TEST(Bf16Test, SubnormalsRoundLikeNormals) {
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);  // tie, even 0
  EXPECT_EQ(FloatToBf16(FromBits(0x00008001u)), 0x0001);
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);  // tie, odd 1 -> 2
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000u)), 0x0001);
  EXPECT_EQ(FloatToBf16(FromBits(0x807FFFFFu)), 0x8080);  // up to -2^-126
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
}

// Against the definition: the nearer of the two bf16 neighbours (computed in
// double), ties to the even one.
TEST(Bf16Test, RandomFloatsRoundToNearest) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    if ((bits & 0x7FFFFFFF) >= 0x7F800000) continue;  // inf and NaN above
    const float x = FromBits(bits);
    const uint32_t below = bits >> 16;  // toward zero
    const uint32_t above = below + 1;   // away from zero (may be inf)
    const double d_below = std::fabs(double{x} - Bf16ToFloat(below));
    const double d_above = std::fabs(
        double{x} - double{Bf16ToFloat(static_cast<uint16_t>(above))});
    uint32_t expected;
    if ((above & 0x7FFF) == 0x7F80) {
      // The neighbour "above" is inf: round as if it were 2^128.
      const double d_limit = std::ldexp(1.0, 128) - std::fabs(double{x});
      expected = (d_below < d_limit || (d_below == d_limit && below % 2 == 0))
                     ? below
                     : above;
    } else {
      expected = (d_below < d_above || (d_below == d_above && below % 2 == 0))
                     ? below
                     : above;
    }
    ASSERT_EQ(FloatToBf16(x), expected) << std::hex << bits;
  }
}

}  // namespace
}  // namespace mneme::formats
