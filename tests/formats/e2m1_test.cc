#include "formats/e2m1.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "tests/formats/reference_formats.h"

namespace mneme::formats {
namespace {

using ::mneme::formats::reference::ReferenceE2m1;
using ::mneme::formats::reference::ReferenceNearest;

TEST(E2m1Test, DecodesEveryCodeAsTheFormatDefines) {
  const float kMagnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int code = 0; code < 16; ++code) {
    SCOPED_TRACE(code);
    const float value = E2m1ToFloat(static_cast<uint8_t>(code));
    EXPECT_EQ(static_cast<double>(value),
              ReferenceE2m1(static_cast<uint8_t>(code)));
    EXPECT_EQ(std::fabs(value), kMagnitudes[code & 7]);
    EXPECT_EQ(std::signbit(value), code >= 8);
    // Only the low nibble counts.
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(code | 0xA0)), value);
  }
  EXPECT_EQ(kE2m1Max, 6.0f);
}

TEST(E2m1Test, EveryCodeRoundTrips) {
  for (int code = 0; code < 16; ++code) {
    SCOPED_TRACE(code);
    EXPECT_EQ(FloatToE2m1(E2m1ToFloat(static_cast<uint8_t>(code))), code);
  }
}

TEST(E2m1Test, MidpointsRoundToEven) {
  for (int code = 0; code < 7; ++code) {
    for (const int sign : {0, 8}) {
      SCOPED_TRACE(::testing::Message() << code << " sign " << sign);
      const uint8_t low = static_cast<uint8_t>(sign | code);
      const uint8_t high = static_cast<uint8_t>(sign | (code + 1));
      const float a = E2m1ToFloat(low);
      const float b = E2m1ToFloat(high);
      const float midpoint = (a + b) / 2;
      EXPECT_EQ(FloatToE2m1(midpoint), code % 2 == 0 ? low : high);
      EXPECT_EQ(FloatToE2m1(std::nextafter(midpoint, a)), low);
      EXPECT_EQ(FloatToE2m1(std::nextafter(midpoint, b)), high);
    }
  }
  // The published list: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
  // 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(0.25f)), 0.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(0.75f)), 1.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(1.25f)), 1.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(1.75f)), 2.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(2.5f)), 2.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(3.5f)), 4.0f);
  EXPECT_EQ(E2m1ToFloat(FloatToE2m1(5.0f)), 4.0f);
}

TEST(E2m1Test, SaturatesAndHandlesNonFinite) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToE2m1(6.5f), 7);
  EXPECT_EQ(FloatToE2m1(1e30f), 7);
  EXPECT_EQ(FloatToE2m1(kInf), 7);
  EXPECT_EQ(FloatToE2m1(-kInf), 15);
  EXPECT_EQ(FloatToE2m1(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(FloatToE2m1(-0.0f), 8);
  EXPECT_EQ(FloatToE2m1(-0.1f), 8);
}

TEST(E2m1Test, RandomValuesEncodeToTheNearestCode) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(-8.0f, 8.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = uniform(rng);
    const uint8_t expected =
        ReferenceNearest(x, 16, [](uint8_t c) { return ReferenceE2m1(c); });
    ASSERT_EQ(FloatToE2m1(x), expected) << x;
  }
}

}  // namespace
}  // namespace mneme::formats
