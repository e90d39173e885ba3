#include "formats/ue8m0.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"
#include "tests/formats/reference_formats.h"

namespace mneme::formats {
namespace {

using ::mneme::formats::reference::ReferenceUe8m0;

TEST(Ue8m0Test, DecodesEveryCodeAsTheFormatDefines) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE(code);
    const float value = Ue8m0ToFloat(static_cast<uint8_t>(code));
    if (code == 255) {
      EXPECT_EQ(std::bit_cast<uint32_t>(value), 0x7FC00000u);
    } else {
      EXPECT_EQ(static_cast<double>(value),
                ReferenceUe8m0(static_cast<uint8_t>(code)));
    }
  }
}

TEST(Ue8m0Test, CodeZeroIsTwoToTheMinus127) {
  EXPECT_EQ(Ue8m0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(std::bit_cast<uint32_t>(Ue8m0ToFloat(0)), 0x00400000u);
  EXPECT_EQ(Ue8m0ToFloat(127), 1.0f);
  EXPECT_EQ(Ue8m0ToFloat(254), std::ldexp(1.0f, 127));
}

TEST(Ue8m0Test, EveryPowerRoundTrips) {
  for (int code = 0; code < 255; ++code) {
    SCOPED_TRACE(code);
    EXPECT_EQ(FloatToUe8m0(Ue8m0ToFloat(static_cast<uint8_t>(code))), code);
  }
}

TEST(Ue8m0Test, EncodeRoundsUpToAPowerOfTwo) {
  for (int code = 1; code < 255; ++code) {
    SCOPED_TRACE(code);
    const float power = Ue8m0ToFloat(static_cast<uint8_t>(code));
    EXPECT_EQ(FloatToUe8m0(std::nextafter(power, 0.0f)), code);
    const int above = code == 254 ? 254 : code + 1;  // saturates at 2^127
    EXPECT_EQ(FloatToUe8m0(std::nextafter(
                  power, std::numeric_limits<float>::infinity())),
              above);
    EXPECT_EQ(FloatToUe8m0(power * 0.75f), code);
  }
  EXPECT_EQ(FloatToUe8m0(3.0f), 129);  // -> 4
  EXPECT_EQ(FloatToUe8m0(1e-38f), 1);  // fp32 subnormal above 2^-127 -> 2^-126
  EXPECT_EQ(FloatToUe8m0(1e-40f), 0);  // below 2^-127
}

TEST(Ue8m0Test, EncodeEdges) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToUe8m0(std::numeric_limits<float>::quiet_NaN()), 255);
  EXPECT_EQ(FloatToUe8m0(kInf), 254);
  EXPECT_EQ(FloatToUe8m0(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(FloatToUe8m0(0.0f), 0);
  EXPECT_EQ(FloatToUe8m0(-1.0f), 0);
  EXPECT_EQ(FloatToUe8m0(-kInf), 0);
  EXPECT_EQ(FloatToUe8m0(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(FloatToUe8m0(std::nextafter(std::ldexp(1.0f, -127), 1.0f)), 1);
}

}  // namespace
}  // namespace mneme::formats
