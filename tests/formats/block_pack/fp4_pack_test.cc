#include "formats/block_pack/fp4_pack.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "gtest/gtest.h"

namespace mneme::formats {
namespace {

TEST(Fp4PackTest, PairsKeepTheEvenElementInTheLowNibble) {
  EXPECT_EQ(PackE2m1Pair(0x3, 0xA), 0xA3);
  EXPECT_EQ(LowE2m1(0xA3), 0x3);
  EXPECT_EQ(HighE2m1(0xA3), 0xA);
  EXPECT_EQ(E2m1OfPair(0xA3, 0), 0x3);
  EXPECT_EQ(E2m1OfPair(0xA3, 1), 0xA);
  for (int byte = 0; byte < 256; ++byte) {
    const uint8_t b = static_cast<uint8_t>(byte);
    EXPECT_EQ(PackE2m1Pair(LowE2m1(b), HighE2m1(b)), b);
  }
}

TEST(Fp4PackTest, PackCodesUsesTheLowFourBits) {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> packed(128);
  PackE2m1Codes(codes, absl::MakeSpan(packed));
  EXPECT_EQ(packed[0], 0x10);
  EXPECT_EQ(packed[1], 0x32);
  EXPECT_EQ(packed[7], 0xFE);
  EXPECT_EQ(packed[8], 0x10);
}

TEST(Fp4PackTest, FastFloatToE2m1MatchesFloatToE2m1) {
  std::vector<float> values = {0.0f, -0.0f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  for (float m = 0.0f; m <= 7.0f; m += 0.125f) {
    values.push_back(m);
    values.push_back(-m);
    values.push_back(std::nextafter(m, 0.0f));
    values.push_back(std::nextafter(m, 8.0f));
  }
  for (float v : values) {
    SCOPED_TRACE(v);
    EXPECT_EQ(FastFloatToE2m1(v), FloatToE2m1(v));
  }
}

TEST(Fp4PackTest, E4m3PowerOfTwoIsExactlyTheRepresentablePowers) {
  for (int p = -12; p <= 12; ++p) {
    SCOPED_TRACE(p);
    const std::optional<uint8_t> code = E4m3PowerOfTwo(p);
    ASSERT_EQ(code.has_value(), p >= -9 && p <= 8);
    if (code.has_value()) {
      EXPECT_EQ(E4m3ToFloat(*code), std::ldexp(1.0f, p));
    }
  }
  EXPECT_EQ(*E4m3PowerOfTwo(-9), 0x01);
  EXPECT_EQ(*E4m3PowerOfTwo(0), 0x38);
  EXPECT_EQ(*E4m3PowerOfTwo(8), 0x78);
}

TEST(Fp4PackTest, Ue8m0ExponentIsTheCodeLessTheBias) {
  EXPECT_EQ(Ue8m0Exponent(127), 0);
  EXPECT_EQ(Ue8m0Exponent(0), -127);
  EXPECT_EQ(Ue8m0Exponent(254), 127);
}

}  // namespace
}  // namespace mneme::formats
