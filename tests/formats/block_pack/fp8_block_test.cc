#include "formats/block_pack/fp8_block.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/block_formats.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"

namespace mneme::formats {
namespace {

TEST(Fp8BlockTest, EncodesOneScalePerSquareBlockAndDecodesBack) {
  // 40 x 40: four blocks, the last row / column partial.
  constexpr int64_t kSide = 40;
  std::vector<float> values(kSide * kSide);
  for (int64_t r = 0; r < kSide; ++r) {
    for (int64_t c = 0; c < kSide; ++c) {
      // Exact e4m3 values times a per-block power of two.
      const float block = (r < 32 ? 1.0f : 4.0f) * (c < 32 ? 1.0f : 0.5f);
      values[r * kSide + c] = block * static_cast<float>((r + c) % 9 - 4);
    }
  }
  std::vector<uint8_t> codes(values.size());
  std::vector<uint8_t> scales;
  EncodeFp8BlockMatrix(values, kSide, absl::MakeSpan(codes), &scales);
  ASSERT_EQ(scales.size(), 4u);
  // amax 4 -> 2^k >= 4 / 448: k = -6.
  EXPECT_EQ(scales[0], FloatToUe8m0(4.0f / kE4m3Max));
  std::vector<float> decoded(values.size());
  DequantizeFp8BlockRows(codes.data(), scales.data(), kSide, 32, 32, 0, kSide,
                         decoded.data());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(decoded[i], values[i]) << i;
  }
}

TEST(Fp8BlockTest, RowAmaxIsTheLargestMagnitude) {
  std::vector<uint8_t> weights(256, 0x00);
  std::vector<uint8_t> scales(8, 127);
  weights[40] = 0xB8;   // -1.0 in block 1
  scales[1] = 130;      // x 8
  weights[200] = 0x40;  // 2.0 in block 6
  EXPECT_EQ(Fp8RowAmax(weights, scales), 8.0f);
  scales[3] = 255;
  EXPECT_TRUE(std::isnan(Fp8RowAmax(weights, scales)));
  scales[3] = 127;
  weights[0] = 0x7F;
  EXPECT_TRUE(std::isnan(Fp8RowAmax(weights, scales)));
  weights[0] = 0x7E;  // 448
  scales[0] = 254;    // x 2^127: beyond fp32
  EXPECT_TRUE(std::isinf(Fp8RowAmax(weights, scales)));
}

}  // namespace
}  // namespace mneme::formats
