#include "formats/row_decode.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/bf16.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "tests/formats/reference_formats.h"

namespace mneme::formats {
namespace {

using ::mneme::formats::reference::ReferenceE2m1;
using ::mneme::formats::reference::ReferenceE4m3;
using ::mneme::formats::reference::ReferenceUe8m0;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// The expected fp32 value from the format definitions, in double (every
// product here is exact in double), rounded once to float.
float ExpectedFp8(uint8_t weight, uint8_t scale) {
  return static_cast<float>(ReferenceE4m3(weight) * ReferenceUe8m0(scale));
}

float ExpectedNvfp4(uint8_t nibble, uint8_t scale, float global_scale) {
  return static_cast<float>(ReferenceE2m1(nibble) * ReferenceE4m3(scale) *
                            double{global_scale});
}

// Same value, or both NaN with the canonical bits.
void ExpectSameValue(float actual, float expected) {
  if (std::isnan(expected)) {
    EXPECT_EQ(std::bit_cast<uint32_t>(actual), 0x7FC00000u);
  } else {
    EXPECT_EQ(std::bit_cast<uint32_t>(actual),
              std::bit_cast<uint32_t>(expected))
        << actual << " vs " << expected;
  }
}

class RowDecodeImplTest : public ::testing::TestWithParam<DecodeImpl> {};

TEST_P(RowDecodeImplTest, Fp8RowsMatchTheDefinition) {
  constexpr size_t kRows = 64;
  const size_t row_bytes = RowBytes(RowFormat::kFp8);
  std::vector<uint8_t> rows = RandomBytes(kRows * row_bytes, 1);
  // Edge scales in the first rows: 2^-127, 2^127 (overflows to inf), NaN.
  const uint8_t kEdgeScales[] = {0, 1, 127, 253, 254, 255};
  for (size_t i = 0; i < std::size(kEdgeScales); ++i) {
    rows[i * row_bytes + kFp8WeightBytes + i % kFp8ScaleBytes] = kEdgeScales[i];
  }
  const RowDecodeOptions options{.format = RowFormat::kFp8, .impl = GetParam()};
  std::vector<float> out(kRows * kRowDim);
  std::vector<uint16_t> out_bf16(kRows * kRowDim);
  ASSERT_TRUE(DecodeRowsF32(options, rows, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(DecodeRowsBf16(options, rows, absl::MakeSpan(out_bf16)).ok());
  for (size_t r = 0; r < kRows; ++r) {
    const uint8_t* row = rows.data() + r * row_bytes;
    for (int i = 0; i < kRowDim; ++i) {
      SCOPED_TRACE(::testing::Message() << "row " << r << " value " << i);
      const float expected =
          ExpectedFp8(row[i], row[kFp8WeightBytes + i / kFp8BlockSize]);
      ExpectSameValue(out[r * kRowDim + i], expected);
      EXPECT_EQ(out_bf16[r * kRowDim + i], FloatToBf16(out[r * kRowDim + i]));
    }
  }
}

TEST_P(RowDecodeImplTest, Nvfp4RowsMatchTheDefinition) {
  constexpr size_t kRows = 32;
  const size_t row_bytes = RowBytes(RowFormat::kNvfp4);
  const std::vector<uint8_t> rows = RandomBytes(kRows * row_bytes, 2);
  for (const float global_scale :
       {1.0f, 0.004092f, 0.008929f, 0.0f, 1e-38f, 3e36f}) {
    SCOPED_TRACE(global_scale);
    const RowDecodeOptions options{.format = RowFormat::kNvfp4,
                                   .global_scale = global_scale,
                                   .impl = GetParam()};
    std::vector<float> out(kRows * kRowDim);
    std::vector<uint16_t> out_bf16(kRows * kRowDim);
    ASSERT_TRUE(DecodeRowsF32(options, rows, absl::MakeSpan(out)).ok());
    ASSERT_TRUE(DecodeRowsBf16(options, rows, absl::MakeSpan(out_bf16)).ok());
    for (size_t r = 0; r < kRows; ++r) {
      const uint8_t* row = rows.data() + r * row_bytes;
      for (int i = 0; i < kRowDim; ++i) {
        SCOPED_TRACE(::testing::Message() << "row " << r << " value " << i);
        const uint8_t packed = row[i / 2];
        const uint8_t nibble = i % 2 == 0 ? packed & 0xF : packed >> 4;
        const float expected = ExpectedNvfp4(
            nibble, row[kNvfp4WeightBytes + i / kNvfp4BlockSize], global_scale);
        ExpectSameValue(out[r * kRowDim + i], expected);
        EXPECT_EQ(out_bf16[r * kRowDim + i], FloatToBf16(out[r * kRowDim + i]));
      }
    }
  }
}

TEST_P(RowDecodeImplTest, SplitBuffersDecodeLikeRawRows) {
  for (const RowFormat format : {RowFormat::kFp8, RowFormat::kNvfp4}) {
    SCOPED_TRACE(RowFormatName(format));
    constexpr size_t kRows = 9;
    const size_t weight_bytes = RowWeightBytes(format);
    const size_t scale_bytes = RowScaleBytes(format);
    const std::vector<uint8_t> rows = RandomBytes(kRows * RowBytes(format), 3);
    std::vector<uint8_t> weights;
    std::vector<uint8_t> scales;
    for (size_t r = 0; r < kRows; ++r) {
      const uint8_t* row = rows.data() + r * RowBytes(format);
      weights.insert(weights.end(), row, row + weight_bytes);
      scales.insert(scales.end(), row + weight_bytes,
                    row + weight_bytes + scale_bytes);
    }
    const RowDecodeOptions options{
        .format = format, .global_scale = 0.25f, .impl = GetParam()};
    std::vector<float> from_raw(kRows * kRowDim);
    std::vector<float> from_split(kRows * kRowDim);
    std::vector<uint16_t> bf16_raw(kRows * kRowDim);
    std::vector<uint16_t> bf16_split(kRows * kRowDim);
    ASSERT_TRUE(DecodeRowsF32(options, rows, absl::MakeSpan(from_raw)).ok());
    ASSERT_TRUE(
        DecodeRowsF32(options, weights, scales, absl::MakeSpan(from_split))
            .ok());
    ASSERT_TRUE(DecodeRowsBf16(options, rows, absl::MakeSpan(bf16_raw)).ok());
    ASSERT_TRUE(
        DecodeRowsBf16(options, weights, scales, absl::MakeSpan(bf16_split))
            .ok());
    for (size_t i = 0; i < from_raw.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(from_raw[i]),
                std::bit_cast<uint32_t>(from_split[i]))
          << i;
    }
    EXPECT_EQ(bf16_raw, bf16_split);
  }
}

TEST_P(RowDecodeImplTest, Fp8ScaleCodeZeroIsTwoToTheMinus127) {
  std::vector<uint8_t> row(RowBytes(RowFormat::kFp8), 0);
  row[0] = 0x08;  // 2^-6
  row[1] = 0x01;  // 2^-9, the smallest subnormal
  row[2] = 0xB8;  // -1
  std::vector<float> out(kRowDim);
  ASSERT_TRUE(DecodeRowsF32({.format = RowFormat::kFp8, .impl = GetParam()},
                            row, absl::MakeSpan(out))
                  .ok());
  EXPECT_EQ(out[0], std::ldexp(1.0f, -133));
  EXPECT_EQ(out[1], std::ldexp(1.0f, -136));
  EXPECT_EQ(out[2], -std::ldexp(1.0f, -127));
  EXPECT_EQ(out[3], 0.0f);
}

TEST_P(RowDecodeImplTest, Nvfp4KnownRow) {
  // Byte 0 = 0xF1: element 0 = 0.5, element 1 = -6. Block 0 scale 2 (0x40).
  std::vector<uint8_t> row(RowBytes(RowFormat::kNvfp4), 0);
  row[0] = 0xF1;
  row[1] = 0x07;  // element 2 = 6, element 3 = +0
  row[kNvfp4WeightBytes] = 0x40;
  row[8] = 0x3A;                      // block 1 (elements 16, 17): 1, 3
  row[kNvfp4WeightBytes + 1] = 0x7F;  // NaN scale
  std::vector<float> out(kRowDim);
  std::vector<uint16_t> out_bf16(kRowDim);
  const RowDecodeOptions options{
      .format = RowFormat::kNvfp4, .global_scale = 0.5f, .impl = GetParam()};
  ASSERT_TRUE(DecodeRowsF32(options, row, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(DecodeRowsBf16(options, row, absl::MakeSpan(out_bf16)).ok());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -6.0f);
  EXPECT_EQ(out[2], 6.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_TRUE(std::isnan(out[16]));
  EXPECT_TRUE(std::isnan(out[17]));
  EXPECT_EQ(out[32], 0.0f);  // scale 0
  EXPECT_EQ(out_bf16[1], 0xC0C0);
  EXPECT_EQ(out_bf16[16], 0x7FC0);
}

TEST_P(RowDecodeImplTest, EmptyInputIsOk) {
  for (const RowFormat format : {RowFormat::kFp8, RowFormat::kNvfp4}) {
    const RowDecodeOptions options{.format = format, .impl = GetParam()};
    EXPECT_TRUE(DecodeRowsF32(options, {}, absl::Span<float>()).ok());
    EXPECT_TRUE(DecodeRowsBf16(options, {}, {}, absl::Span<uint16_t>()).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, RowDecodeImplTest,
                         ::testing::Values(DecodeImpl::kAuto,
                                           DecodeImpl::kScalar,
                                           DecodeImpl::kSimd),
                         [](const auto& info) {
                           switch (info.param) {
                             case DecodeImpl::kAuto:
                               return "Auto";
                             case DecodeImpl::kScalar:
                               return "Scalar";
                             case DecodeImpl::kSimd:
                               return "Simd";
                           }
                           return "Unknown";
                         });

TEST(RowDecodeTest, UnspecifiedFormatIsInvalidArgument) {
  std::vector<uint8_t> rows(264);
  std::vector<float> out(kRowDim);
  std::vector<uint16_t> out_bf16(kRowDim);
  const RowDecodeOptions options;  // format kUnspecified
  EXPECT_EQ(DecodeRowsF32(options, rows, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRowsBf16(options, rows, absl::MakeSpan(out_bf16)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeRowsF32(options, rows, rows, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  const RowDecodeOptions bogus{.format = static_cast<RowFormat>(7)};
  EXPECT_EQ(DecodeRowsF32(bogus, rows, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RowDecodeTest, UnknownImplIsInvalidArgument) {
  std::vector<uint8_t> rows(RowBytes(RowFormat::kFp8));
  std::vector<float> out(kRowDim);
  const RowDecodeOptions options{.format = RowFormat::kFp8,
                                 .impl = static_cast<DecodeImpl>(9)};
  EXPECT_EQ(DecodeRowsF32(options, rows, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RowDecodeTest, WrongSizesAreInvalidArgument) {
  for (const RowFormat format : {RowFormat::kFp8, RowFormat::kNvfp4}) {
    SCOPED_TRACE(RowFormatName(format));
    const RowDecodeOptions options{.format = format};
    const size_t row_bytes = RowBytes(format);
    std::vector<float> out(size_t{2} * kRowDim);
    std::vector<uint16_t> out_bf16(size_t{2} * kRowDim);
    // Not a whole number of rows.
    std::vector<uint8_t> partial(2 * row_bytes - 1);
    EXPECT_EQ(DecodeRowsF32(options, partial, absl::MakeSpan(out)).code(),
              absl::StatusCode::kInvalidArgument);
    // Output too small / too large.
    std::vector<uint8_t> rows(2 * row_bytes);
    EXPECT_EQ(DecodeRowsF32(options, rows,
                            absl::MakeSpan(out).subspan(0, 2 * kRowDim - 1))
                  .code(),
              absl::StatusCode::kInvalidArgument);
    std::vector<uint16_t> big(size_t{3} * kRowDim);
    EXPECT_EQ(DecodeRowsBf16(options, rows, absl::MakeSpan(big)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(DecodeRowsBf16(options, rows, absl::MakeSpan(out_bf16)).ok());
    // Split buffers that disagree on the row count, or are partial.
    std::vector<uint8_t> weights(2 * RowWeightBytes(format));
    std::vector<uint8_t> scales(2 * RowScaleBytes(format));
    std::vector<uint8_t> one_scale(RowScaleBytes(format));
    std::vector<uint8_t> ragged(2 * RowScaleBytes(format) + 1);
    EXPECT_TRUE(
        DecodeRowsF32(options, weights, scales, absl::MakeSpan(out)).ok());
    EXPECT_EQ(
        DecodeRowsF32(options, weights, one_scale, absl::MakeSpan(out)).code(),
        absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DecodeRowsBf16(options, weights, ragged, absl::MakeSpan(out_bf16))
                  .code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DecodeRowsF32(options, weights, scales,
                            absl::MakeSpan(out).subspan(0, kRowDim))
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(RowDecodeTest, InvalidNvfp4GlobalScaleIsInvalidArgument) {
  std::vector<uint8_t> rows(RowBytes(RowFormat::kNvfp4));
  std::vector<float> out(kRowDim);
  for (const float global_scale : {kNan, kInf, -kInf, -1.0f}) {
    SCOPED_TRACE(global_scale);
    const RowDecodeOptions options{.format = RowFormat::kNvfp4,
                                   .global_scale = global_scale};
    EXPECT_EQ(DecodeRowsF32(options, rows, absl::MakeSpan(out)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  // FP8 ignores the global scale.
  std::vector<uint8_t> fp8_rows(RowBytes(RowFormat::kFp8));
  EXPECT_TRUE(DecodeRowsF32({.format = RowFormat::kFp8, .global_scale = kNan},
                            fp8_rows, absl::MakeSpan(out))
                  .ok());
}

TEST(RowDecodeTest, SimdTargetIsNamed) {
  EXPECT_NE(std::string(DecodeSimdTargetName()), "");
}

}  // namespace
}  // namespace mneme::formats
