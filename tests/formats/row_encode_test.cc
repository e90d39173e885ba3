#include "formats/row_encode.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_format.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"
#include "tests/formats/reference_formats.h"

namespace mneme::formats {
namespace {

using ::mneme::formats::reference::ReferenceE2m1;
using ::mneme::formats::reference::ReferenceE4m3;
using ::mneme::formats::reference::ReferenceNearest;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Heavy-tailed values (a normal times a log-normal), like Engram rows.
std::vector<float> HeavyTailedRow(std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(kRowDim);
  for (float& v : values) v = scale * normal(rng) * std::exp(normal(rng));
  return values;
}

std::vector<float> DecodeOne(RowFormat format, float global_scale,
                             const std::vector<uint8_t>& row) {
  std::vector<float> out(kRowDim);
  const absl::Status status =
      DecodeRowsF32({.format = format, .global_scale = global_scale}, row,
                    absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<uint8_t> EncodeFp8(const std::vector<float>& values) {
  std::vector<uint8_t> row(RowBytes(RowFormat::kFp8));
  const absl::Status status = EncodeFp8Row(values, absl::MakeSpan(row));
  EXPECT_TRUE(status.ok()) << status;
  return row;
}

std::vector<uint8_t> EncodeNvfp4(const std::vector<float>& values,
                                 float global_scale) {
  std::vector<uint8_t> row(RowBytes(RowFormat::kNvfp4));
  const absl::Status status =
      EncodeNvfp4Row(values, global_scale, absl::MakeSpan(row));
  EXPECT_TRUE(status.ok()) << status;
  return row;
}

TEST(EncodeFp8RowTest, BlockScaleIsTheSmallestSufficientPowerOfTwo) {
  std::vector<float> values(kRowDim, 0.0f);
  values[0] = 448.0f;      // block 0: 448 / 2^0 <= 448
  values[32] = 449.0f;     // block 1: needs 2^1
  values[64 + 5] = -1.0f;  // block 2: 1 / 2^-8 = 256 (2^-9 would give 512)
  values[96] = 1e-40f;     // block 3: far below 448 * 2^-127: clamps
  values[128] = 3e38f;     // block 4: large
  // block 5: all zero; blocks 6, 7: -0.0 and a subnormal e4m3 value
  values[192] = -0.0f;
  values[224] = 0.5f;
  values[225] = 0.5f / 512;  // 2^-10 relative to 0.5: subnormal e4m3
  const std::vector<uint8_t> row = EncodeFp8(values);
  const uint8_t* scales = row.data() + kFp8WeightBytes;
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(row[0], 0x7E);
  EXPECT_EQ(scales[1], 128);
  EXPECT_EQ(scales[2], 127 - 8);
  EXPECT_EQ(row[64 + 5], 0xF8);  // -256 = -2^8
  EXPECT_EQ(scales[3], 0);
  EXPECT_EQ(scales[5], 0);  // zero block: 2^-127
  for (int i = 160; i < 192; ++i) EXPECT_EQ(row[i], 0x00);
  EXPECT_EQ(row[192], 0x80);
  const std::vector<float> decoded = DecodeOne(RowFormat::kFp8, 1.0f, row);
  EXPECT_EQ(decoded[0], 448.0f);
  EXPECT_EQ(decoded[32], 448.0f);  // 449 / 2 = 224.5 rounds to 224
  EXPECT_EQ(decoded[69], -1.0f);
  EXPECT_EQ(decoded[224], 0.5f);
  EXPECT_EQ(decoded[225], 0.5f / 512);
}

TEST(EncodeFp8RowTest, ScaleChoiceMatchesTheDefinitionOnRandomBlocks) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> log2_scale(-150.0f, 120.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::vector<float> values =
        HeavyTailedRow(rng, std::exp2(log2_scale(rng)));
    const std::vector<uint8_t> row = EncodeFp8(values);
    for (int block = 0; block < 8; ++block) {
      double amax = 0;
      for (int j = 0; j < kFp8BlockSize; ++j) {
        amax = std::max(amax, std::fabs(double{values[block * 32 + j]}));
      }
      const int k = row[kFp8WeightBytes + block] - 127;
      ASSERT_LE(amax, 448.0 * std::ldexp(1.0, k));
      if (k > -127) {
        ASSERT_GT(amax, 448.0 * std::ldexp(1.0, k - 1));
      }
    }
  }
}

TEST(EncodeFp8RowTest, ErrorIsWithinHalfAnE4m3Step) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> log2_scale(-100.0f, 100.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::vector<float> values =
        HeavyTailedRow(rng, std::exp2(log2_scale(rng)));
    const std::vector<uint8_t> row = EncodeFp8(values);
    const std::vector<float> decoded = DecodeOne(RowFormat::kFp8, 1.0f, row);
    for (int i = 0; i < kRowDim; ++i) {
      const double scale = Ue8m0ToFloat(row[kFp8WeightBytes + i / 32]);
      const double x = values[i];
      // Relative 2^-4 for normal e4m3, absolute 2^-10 * scale below 2^-6.
      const double bound = std::max(std::fabs(x) * 0x1p-4, scale * 0x1p-10);
      ASSERT_LE(std::fabs(decoded[i] - x), bound) << "value " << i;
    }
    // Re-encoding decoded values reproduces them exactly.
    EXPECT_EQ(DecodeOne(RowFormat::kFp8, 1.0f, EncodeFp8(decoded)), decoded);
  }
}

TEST(EncodeNvfp4RowTest, KnownBlocks) {
  std::vector<float> values(kRowDim, 0.0f);
  // Block 0: the e2m1 grid times 2 (amax 12 -> scale 12 / 6 = 2, exact).
  const float kGrid[16] = {0,     0.5f, 1,     1.5f, 2,  3,  4,  6,
                           -0.5f, -1,   -1.5f, -2,   -3, -4, -6, 6};
  for (int j = 0; j < 16; ++j) values[j] = 2 * kGrid[j];
  // Block 1: all zero. Block 2: below the smallest e4m3 scale: underflows.
  for (int j = 32; j < 48; ++j) values[j] = 1e-6f;
  const std::vector<uint8_t> row = EncodeNvfp4(values, 1.0f);
  const uint8_t* scales = row.data() + kNvfp4WeightBytes;
  EXPECT_EQ(scales[0], FloatToE4m3(2.0f));
  EXPECT_EQ(row[0], 0x10);  // 0 (low) and 0.5 (high)
  EXPECT_EQ(row[7], 0x7F);  // -6 (0xF) low, 6 (0x7) high
  EXPECT_EQ(scales[1], 0x00);
  EXPECT_EQ(scales[2], 0x00);
  for (int i = 8; i < 24; ++i) EXPECT_EQ(row[i], 0x00) << i;
  const std::vector<float> decoded = DecodeOne(RowFormat::kNvfp4, 1.0f, row);
  for (int j = 0; j < 48; ++j) {
    EXPECT_EQ(decoded[j], j < 16 ? values[j] : 0.0f) << j;
  }
}

// Each block scale and each code is the nearest one, found by brute force.
TEST(EncodeNvfp4RowTest, CodesAreTheNearestOnRandomRows) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 500; ++trial) {
    const std::vector<float> values = HeavyTailedRow(rng, 0.05f);
    float amax = 0;
    for (float v : values) amax = std::max(amax, std::fabs(v));
    const float global_scale = Nvfp4GlobalScale(amax);
    const std::vector<uint8_t> row = EncodeNvfp4(values, global_scale);
    for (int block = 0; block < 16; ++block) {
      float block_amax = 0;
      for (int j = 0; j < 16; ++j) {
        block_amax = std::max(block_amax, std::fabs(values[block * 16 + j]));
      }
      const uint8_t scale = row[kNvfp4WeightBytes + block];
      ASSERT_EQ(scale, ReferenceNearest(block_amax / 6.0f / global_scale, 256,
                                        ReferenceE4m3));
      const float step = E4m3ToFloat(scale) * global_scale;
      for (int j = 0; j < 16; ++j) {
        const int i = block * 16 + j;
        const uint8_t code = (row[i / 2] >> (4 * (i % 2))) & 0xF;
        const uint8_t expected =
            step == 0 ? 0
                      : ReferenceNearest(values[i] / step, 16, ReferenceE2m1);
        ASSERT_EQ(code, expected) << "value " << i;
      }
    }
  }
}

TEST(EncodeNvfp4RowTest, ErrorIsBounded) {
  std::mt19937 rng(9);
  double error_squares = 0;
  double value_squares = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const std::vector<float> values = HeavyTailedRow(rng, 0.3f);
    float amax = 0;
    for (float v : values) amax = std::max(amax, std::fabs(v));
    const float global_scale = Nvfp4GlobalScale(amax);
    const std::vector<uint8_t> row = EncodeNvfp4(values, global_scale);
    const std::vector<float> decoded =
        DecodeOne(RowFormat::kNvfp4, global_scale, row);
    for (int i = 0; i < kRowDim; ++i) {
      const double step =
          double{E4m3ToFloat(row[kNvfp4WeightBytes + i / 16])} * global_scale;
      const double error = std::fabs(double{decoded[i]} - values[i]);
      // Half the widest e2m1 gap (4 -> 6) is one step; blocks whose scale
      // rounded down clip at 6 steps, less than one step away.
      ASSERT_LE(error, step * (1 + 1e-6)) << "value " << i;
      error_squares += error * error;
      value_squares += double{values[i]} * values[i];
    }
  }
  // Relative RMS error, near the published ~9-10 % for round-to-nearest.
  EXPECT_LT(std::sqrt(error_squares / value_squares), 0.12);
}

TEST(EncodeNvfp4RowTest, GlobalScaleFromTableAmax) {
  EXPECT_EQ(Nvfp4GlobalScale(11.0f), 11.0f / 2688.0f);
  EXPECT_NEAR(Nvfp4GlobalScale(11.0f), 0.004092f, 5e-7f);
  EXPECT_NEAR(Nvfp4GlobalScale(24.0f), 0.008929f, 5e-7f);
  EXPECT_EQ(Nvfp4GlobalScale(0.0f), 1.0f);
  // The largest block then gets the largest e4m3 scale.
  EXPECT_EQ(FloatToE4m3(11.0f / 6.0f / Nvfp4GlobalScale(11.0f)), 0x7E);
}

TEST(EncodeRowTest, SplitAndRawLayoutsAgree) {
  std::mt19937 rng(10);
  const std::vector<float> values = HeavyTailedRow(rng, 1.0f);
  std::vector<uint8_t> weights(kFp8WeightBytes);
  std::vector<uint8_t> scales(kFp8ScaleBytes);
  ASSERT_TRUE(
      EncodeFp8Row(values, absl::MakeSpan(weights), absl::MakeSpan(scales))
          .ok());
  std::vector<uint8_t> joined = weights;
  joined.insert(joined.end(), scales.begin(), scales.end());
  EXPECT_EQ(EncodeFp8(values), joined);

  std::vector<uint8_t> nv_weights(kNvfp4WeightBytes);
  std::vector<uint8_t> nv_scales(kNvfp4ScaleBytes);
  ASSERT_TRUE(EncodeNvfp4Row(values, 0.01f, absl::MakeSpan(nv_weights),
                             absl::MakeSpan(nv_scales))
                  .ok());
  std::vector<uint8_t> nv_joined = nv_weights;
  nv_joined.insert(nv_joined.end(), nv_scales.begin(), nv_scales.end());
  EXPECT_EQ(EncodeNvfp4(values, 0.01f), nv_joined);
}

TEST(EncodeRowTest, BadArgumentsAreInvalidArgument) {
  const std::vector<float> values(kRowDim, 1.0f);
  const std::vector<float> short_values(kRowDim - 1, 1.0f);
  std::vector<uint8_t> fp8(RowBytes(RowFormat::kFp8));
  std::vector<uint8_t> nvfp4(RowBytes(RowFormat::kNvfp4));
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

  EXPECT_EQ(EncodeFp8Row(short_values, absl::MakeSpan(fp8)).code(), kInvalid);
  EXPECT_EQ(EncodeFp8Row(values, absl::MakeSpan(nvfp4)).code(), kInvalid);
  EXPECT_EQ(EncodeFp8Row(values, absl::MakeSpan(fp8).subspan(0, 256),
                         absl::MakeSpan(fp8).subspan(256, 7))
                .code(),
            kInvalid);
  EXPECT_EQ(EncodeNvfp4Row(short_values, 1.0f, absl::MakeSpan(nvfp4)).code(),
            kInvalid);
  EXPECT_EQ(EncodeNvfp4Row(values, 1.0f, absl::MakeSpan(fp8)).code(), kInvalid);
  for (const float global_scale : {0.0f, -1.0f, kNan, kInf}) {
    EXPECT_EQ(
        EncodeNvfp4Row(values, global_scale, absl::MakeSpan(nvfp4)).code(),
        kInvalid)
        << global_scale;
  }
  for (const float bad : {kNan, kInf, -kInf}) {
    std::vector<float> with_bad = values;
    with_bad[77] = bad;
    EXPECT_EQ(EncodeFp8Row(with_bad, absl::MakeSpan(fp8)).code(), kInvalid);
    EXPECT_EQ(EncodeNvfp4Row(with_bad, 1.0f, absl::MakeSpan(nvfp4)).code(),
              kInvalid);
  }
}

}  // namespace
}  // namespace mneme::formats
