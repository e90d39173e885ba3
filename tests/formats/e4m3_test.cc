#include "formats/e4m3.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "tests/formats/reference_formats.h"

namespace mneme::formats {
namespace {

using ::mneme::formats::reference::ReferenceE4m3;
using ::mneme::formats::reference::ReferenceNearest;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(E4m3Test, DecodesEveryCodeAsTheFormatDefines) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE(code);
    const float value = E4m3ToFloat(static_cast<uint8_t>(code));
    const double expected = ReferenceE4m3(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_EQ(Bits(value), 0x7FC00000u);  // one canonical quiet NaN
    } else {
      EXPECT_EQ(static_cast<double>(value), expected);
      EXPECT_EQ(std::signbit(value), (code & 0x80) != 0);  // -0 for 0x80
    }
  }
}

TEST(E4m3Test, NamedCodes) {
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0xFE), -448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(E4m3ToFloat(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
  EXPECT_EQ(kE4m3Max, 448.0f);
}

TEST(E4m3Test, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    SCOPED_TRACE(code);
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(code))), code);
  }
}

TEST(E4m3Test, MidpointsRoundToEven) {
  // Consecutive positive codes c, c + 1 up to 448; mirrored for negatives.
  for (int code = 0; code < 0x7E; ++code) {
    for (const int sign : {0x00, 0x80}) {
      SCOPED_TRACE(::testing::Message() << code << " sign " << sign);
      const uint8_t low = static_cast<uint8_t>(sign | code);
      const uint8_t high = static_cast<uint8_t>(sign | (code + 1));
      const float a = E4m3ToFloat(low);
      const float b = E4m3ToFloat(high);
      const float midpoint = (a + b) / 2;  // exact in fp32
      const uint8_t even = (code % 2 == 0) ? low : high;
      EXPECT_EQ(FloatToE4m3(midpoint), even);
      EXPECT_EQ(FloatToE4m3(std::nextafter(midpoint, a)), low);
      EXPECT_EQ(FloatToE4m3(std::nextafter(midpoint, b)), high);
    }
  }
}

TEST(E4m3Test, SaturatesFiniteAndInfiniteValues) {
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7E);  // midpoint to the absent 480
  EXPECT_EQ(FloatToE4m3(std::nextafter(464.0f, 1e9f)), 0x7E);
  EXPECT_EQ(FloatToE4m3(1e6f), 0x7E);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::max()), 0x7E);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::max()), 0xFE);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::infinity()), 0xFE);
}

TEST(E4m3Test, NanEncodesAs7F) {
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToE4m3(std::bit_cast<float>(0x7F800001u)), 0x7F);  // sNaN
}

TEST(E4m3Test, TinyValuesRoundToSignedZero) {
  EXPECT_EQ(FloatToE4m3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4m3(0x1p-10f), 0x00);  // half the smallest subnormal
  EXPECT_EQ(FloatToE4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(FloatToE4m3(1e-30f), 0x00);
  EXPECT_EQ(FloatToE4m3(-1e-30f), 0x80);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
}

TEST(E4m3Test, RandomValuesEncodeToTheNearestCode) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> log2_magnitude(-14.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(log2_magnitude(rng));
    if ((rng() & 1) != 0) x = -x;
    const uint8_t expected =
        ReferenceNearest(x, 256, [](uint8_t c) { return ReferenceE4m3(c); });
    ASSERT_EQ(FloatToE4m3(x), expected) << x;
  }
}

}  // namespace
}  // namespace mneme::formats
