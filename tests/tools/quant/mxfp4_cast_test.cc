#include "tools/quant/mxfp4_cast.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"

namespace mneme::quant {
namespace {

using formats::E2m1ToFloat;
using formats::E4m3ToFloat;
using formats::Ue8m0ToFloat;

struct Tensor {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> packed, scales;
};

Tensor RandomTensor(int64_t rows, int64_t cols, int base, int spread,
                    uint64_t seed) {
  Tensor t{rows, cols, std::vector<uint8_t>(rows * cols / 2),
           std::vector<uint8_t>(rows * cols / 32)};
  uint64_t s = seed * 2 + 1;
  auto next = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return s >> 33;
  };
  for (uint8_t& b : t.packed) b = static_cast<uint8_t>(next());
  for (uint8_t& e : t.scales) {
    e = static_cast<uint8_t>(base + static_cast<int>(next() % (spread + 1)));
  }
  return t;
}

float SourceValue(const Tensor& t, int64_t r, int64_t i) {
  const uint8_t byte = t.packed[(r * t.cols + i) / 2];
  return E2m1ToFloat((byte >> (4 * (i % 2))) & 0xF) *
         Ue8m0ToFloat(t.scales[r * (t.cols / 32) + i / 32]);
}

float TargetValue(const std::vector<uint8_t>& packed,
                  const std::vector<uint8_t>& scales, int64_t cols, float ws2,
                  int64_t r, int64_t i) {
  const uint8_t byte = packed[(r * cols + i) / 2];
  return (E2m1ToFloat((byte >> (4 * (i % 2))) & 0xF) *
          E4m3ToFloat(scales[r * (cols / 16) + i / 16])) *
         ws2;
}

TEST(E4m3PowerOfTwoTest, ExactlyTheRepresentablePowers) {
  for (int p = -9; p <= 8; ++p) {
    const std::optional<uint8_t> code = E4m3PowerOfTwo(p);
    ASSERT_TRUE(code.has_value()) << p;
    EXPECT_EQ(E4m3ToFloat(*code), std::ldexp(1.0f, p)) << p;
    EXPECT_EQ(*code, formats::FloatToE4m3(std::ldexp(1.0f, p)));
  }
  EXPECT_EQ(*E4m3PowerOfTwo(-9), 0x01);
  EXPECT_EQ(*E4m3PowerOfTwo(0), 0x38);
  EXPECT_EQ(*E4m3PowerOfTwo(8), 0x78);
  EXPECT_FALSE(E4m3PowerOfTwo(-10).has_value());
  EXPECT_FALSE(E4m3PowerOfTwo(9).has_value());
}

TEST(MaxBlockExponentTest, LargestExponentAndErrors) {
  const std::vector<uint8_t> scales = {120, 0, 131, 127};
  EXPECT_EQ(*MaxBlockExponent(scales), 4);
  EXPECT_EQ(*MaxBlockExponent(std::vector<uint8_t>{0}), -127);
  EXPECT_EQ(MaxBlockExponent({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxBlockExponent(std::vector<uint8_t>{1, 255}).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(CastMxfp4TensorTest, KnownScalesEncodeBitExactly) {
  // k_max = 0 -> weight_scale_2 = 2^-8; a block with 2^0 gets 2^8 (0x78),
  // one with 2^-7 gets 2^1 (0x40), one with 2^-16 gets 2^-8 (0x02).
  Tensor t{1, 96, std::vector<uint8_t>(48, 0x3A), {127, 120, 111}};
  std::vector<uint8_t> packed(48), scales(6);
  CastStats stats;
  ASSERT_TRUE(CastMxfp4Tensor(1, 96, t.packed, t.scales, -8,
                              absl::MakeSpan(packed), absl::MakeSpan(scales),
                              &stats)
                  .ok());
  EXPECT_EQ(scales, (std::vector<uint8_t>{0x78, 0x78, 0x40, 0x40, 0x02, 0x02}));
  EXPECT_EQ(packed, t.packed);
  EXPECT_EQ(stats.blocks, 3);
  EXPECT_EQ(stats.lossless_blocks, 3);
  EXPECT_EQ(stats.max_abs_error, 0.0);
}

TEST(CastMxfp4TensorTest, CastableBlocksKeepEveryNibbleAndValue) {
  // Exponents spread over 18 powers of two (k_max - 17 .. k_max): all
  // castable, including the e4m3 subnormal scales; also the extremes of
  // UE8M0 (code 0 = 2^-127 with a subnormal weight_scale_2).
  for (auto [base, spread] : {std::pair{110, 17}, std::pair{0, 17},
                              std::pair{230, 17}, std::pair{120, 0}}) {
    const Tensor t = RandomTensor(37, 128, base, spread, base + 1);
    const int k_max = *MaxBlockExponent(t.scales);
    const int ws2_exponent = WeightScale2Exponent(k_max);
    std::vector<uint8_t> packed(t.packed.size()), scales(t.scales.size() * 2);
    CastStats stats;
    std::vector<LossyBlock> lossy;
    ASSERT_TRUE(CastMxfp4Tensor(t.rows, t.cols, t.packed, t.scales,
                                ws2_exponent, absl::MakeSpan(packed),
                                absl::MakeSpan(scales), &stats, &lossy, 10)
                    .ok());
    EXPECT_EQ(packed, t.packed) << "base " << base;
    const float ws2 = std::ldexp(1.0f, ws2_exponent);
    for (int64_t r = 0; r < t.rows; ++r) {
      for (int64_t i = 0; i < t.cols; ++i) {
        ASSERT_EQ(TargetValue(packed, scales, t.cols, ws2, r, i),
                  SourceValue(t, r, i))
            << "base " << base << " row " << r << " value " << i;
      }
    }
    EXPECT_EQ(stats.blocks, t.rows * t.cols / 32);
    EXPECT_EQ(stats.castable_blocks, stats.blocks);
    EXPECT_EQ(stats.lossless_blocks, stats.blocks);
    EXPECT_EQ(stats.max_abs_error, 0.0);
    EXPECT_TRUE(lossy.empty());
  }
}

TEST(CastMxfp4TensorTest, UncastableBlocksAreReportedAndBounded) {
  Tensor t = RandomTensor(8, 64, 124, 3, 5);
  const int k_max = *MaxBlockExponent(t.scales);
  // Row 3, block 1: 20 powers of two below k_max (p = -12). Row 5, block 0:
  // the same, but all nibbles zero (still exact).
  t.scales[3 * 2 + 1] = static_cast<uint8_t>(k_max + 127 - 20);
  t.scales[5 * 2 + 0] = static_cast<uint8_t>(k_max + 127 - 20);
  for (int j = 0; j < 16; ++j) t.packed[5 * 32 + j] = 0;
  const int ws2_exponent = WeightScale2Exponent(k_max);
  std::vector<uint8_t> packed(t.packed.size()), scales(t.scales.size() * 2);
  CastStats stats;
  std::vector<LossyBlock> lossy;
  ASSERT_TRUE(CastMxfp4Tensor(t.rows, t.cols, t.packed, t.scales, ws2_exponent,
                              absl::MakeSpan(packed), absl::MakeSpan(scales),
                              &stats, &lossy, 10)
                  .ok());
  EXPECT_EQ(stats.blocks, 16);
  EXPECT_EQ(stats.castable_blocks, 14);
  EXPECT_EQ(stats.lossless_blocks, 15);
  ASSERT_EQ(lossy.size(), 1u);
  EXPECT_EQ(lossy[0].row, 3);
  EXPECT_EQ(lossy[0].block, 1);
  EXPECT_EQ(lossy[0].exponent, k_max - 20);
  EXPECT_EQ(lossy[0].power, -12);
  EXPECT_EQ(scales[3 * 4 + 2], 0x01);
  EXPECT_EQ(scales[3 * 4 + 3], 0x01);
  // Error at most half the smallest step 2^-9 x weight_scale_2.
  const double half_step = 0.5 * std::ldexp(1.0, ws2_exponent - 9);
  EXPECT_GT(stats.max_abs_error, 0.0);
  EXPECT_LE(stats.max_abs_error, half_step);
  EXPECT_EQ(lossy[0].max_abs_error, stats.max_abs_error);
  // Every other block kept its nibbles.
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t j = 0; j < 32; ++j) {
      if (r == 3 && j >= 16) continue;
      EXPECT_EQ(packed[r * 32 + j], t.packed[r * 32 + j]);
    }
  }
}

TEST(CastMxfp4TensorTest, RejectsBadInput) {
  const Tensor t = RandomTensor(2, 64, 120, 2, 1);
  std::vector<uint8_t> packed(64), scales(8);
  CastStats stats;
  // Wrong column count, wrong output size.
  EXPECT_EQ(
      CastMxfp4Tensor(2, 48, t.packed, t.scales, -8, absl::MakeSpan(packed),
                      absl::MakeSpan(scales), &stats)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CastMxfp4Tensor(2, 64, t.packed, t.scales, -8,
                            absl::MakeSpan(packed).first(10),
                            absl::MakeSpan(scales), &stats)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // weight_scale_2 too small for the largest block.
  EXPECT_EQ(
      CastMxfp4Tensor(2, 64, t.packed, t.scales, -30, absl::MakeSpan(packed),
                      absl::MakeSpan(scales), &stats)
          .code(),
      absl::StatusCode::kInvalidArgument);
  Tensor nan = t;
  nan.scales[3] = 255;
  EXPECT_EQ(
      CastMxfp4Tensor(2, 64, nan.packed, nan.scales, 0, absl::MakeSpan(packed),
                      absl::MakeSpan(scales), &stats)
          .code(),
      absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace mneme::quant
