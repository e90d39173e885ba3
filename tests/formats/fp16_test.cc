// fp16 conversions against an independent reference: the value of every
// code from its fields in double, and rounding by search for the nearest
// code (ties to the even code, past 65504 + half a step to infinity).

#include "formats/fp16.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mneme::formats {
namespace {

double ReferenceValue(uint16_t bits) {
  const double sign = (bits & 0x8000u) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  if (exponent == 0x1F) {
    return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                         : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// The nearest fp16 code of a finite value: the positive codes are ordered
// like their values, so a binary search over them finds the neighbours.
uint16_t ReferenceRound(float value) {
  const double v = std::fabs(static_cast<double>(value));
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  // 65504 plus half its step (32) rounds to infinity (even: 0x7C00).
  if (v >= 65520.0) return sign | 0x7C00;
  uint16_t lo = 0;
  uint16_t hi = 0x7BFF;
  while (lo < hi) {  // the last code <= v
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (ReferenceValue(mid) <= v) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  if (lo == 0x7BFF) return sign | lo;
  const double below = ReferenceValue(lo);
  const double above = ReferenceValue(static_cast<uint16_t>(lo + 1));
  uint16_t code = lo;
  if (v - below > above - v || (v - below == above - v && (lo & 1) != 0)) {
    code = static_cast<uint16_t>(lo + 1);
  }
  return sign | code;
}

TEST(Fp16, EveryCodeDecodesExactlyAndRoundTrips) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const auto code = static_cast<uint16_t>(bits);
    const float value = Fp16ToFloat(code);
    const double expected = ReferenceValue(code);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(value)) << bits;
      ASSERT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(value)))) << bits;
      continue;
    }
    ASSERT_EQ(static_cast<double>(value), expected) << bits;
    ASSERT_EQ(std::signbit(value), (bits & 0x8000u) != 0) << bits;
    ASSERT_EQ(FloatToFp16(value), code) << bits;
  }
}

TEST(Fp16, RoundsToTheNearestEvenCode) {
  std::mt19937 rng(5);
  for (int i = 0; i < 300000; ++i) {
    // fp32 values around the fp16 range, subnormals and overflow included.
    uint32_t bits = rng();
    const uint32_t exponent = 95 + rng() % 50;  // 2^-32 .. 2^17
    bits = (bits & 0x807FFFFFu) | (exponent << 23);
    const float value = std::bit_cast<float>(bits);
    ASSERT_EQ(FloatToFp16(value), ReferenceRound(value)) << value;
  }
  // Ties between normals, halfway points in the subnormals, the overflow
  // boundary.
  for (const float value :
       {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-25f, 3 * 0x1p-25f,
        0x1.8p-25f, 0x1p-26f, 65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e9f,
        -65520.0f, 0.0f, -0.0f, std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(FloatToFp16(value), ReferenceRound(value)) << value;
  }
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToFp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(std::isnan(
      Fp16ToFloat(FloatToFp16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace mneme::formats
