#include "formats/block_formats.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/formats/reference_formats.h"

namespace mneme::formats {
namespace {

using ::mneme::formats::reference::ReferenceE2m1;
using ::mneme::formats::reference::ReferenceE4m3;
using ::mneme::formats::reference::ReferenceUe8m0;

// Written where a function must not write.
constexpr float kSentinel = -12345.0f;

// Expects `actual` to be `expected` (an exact product of reference values in
// double) rounded once to fp32: bit-equal, or both NaN.
void ExpectRoundedOnce(float actual, double expected, int64_t index) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << "value " << index << ": " << actual;
    return;
  }
  const float want = static_cast<float>(expected);
  uint32_t actual_bits, want_bits;
  std::memcpy(&actual_bits, &actual, 4);
  std::memcpy(&want_bits, &want, 4);
  EXPECT_EQ(actual_bits, want_bits)
      << "value " << index << ": " << actual << " vs " << want;
}

TEST(BlockFormatsTest, ByteCounts) {
  EXPECT_EQ(Fp8BlockScaleBytes(32, 32, 32, 32), 1);
  EXPECT_EQ(Fp8BlockScaleBytes(33, 32, 32, 32), 2);
  EXPECT_EQ(Fp8BlockScaleBytes(5, 70, 2, 32), 3 * 3);
  EXPECT_EQ(Fp8BlockScaleBytes(1, 1, 128, 128), 1);
  EXPECT_EQ(Fp8BlockScaleBytes(7168, 2048, 32, 32), 224 * 64);
  EXPECT_EQ(Fp4DataBytes(3, 64), 96);
  EXPECT_EQ(Mxfp4ScaleBytes(3, 64), 6);
  EXPECT_EQ(Nvfp4ScaleBytes(3, 64), 12);
  EXPECT_EQ(kMxfp4GroupSize, 32);
  EXPECT_EQ(kNvfp4GroupSize, 16);
}

// Every e4m3 code against every scale-edge UE8M0 code (0 = 2^-127, 1, 127 =
// 1, 254 = 2^127, 255 = NaN), in ragged blocks (70 is not a multiple of 32,
// 5 not of 2).
TEST(BlockFormatsTest, Fp8BlockMatchesTheReferenceExactly) {
  const int64_t rows = 5, cols = 70;
  const int block_rows = 2, block_cols = 32;
  std::vector<uint8_t> codes(rows * cols);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>(i * 7 % 256);
  }
  // Every code at least once.
  for (int code = 0; code < 256; ++code) codes[code] = code;
  const std::vector<uint8_t> scales = {0, 1, 127, 254, 255, 126, 128, 3, 200};
  ASSERT_EQ(static_cast<int64_t>(scales.size()),
            Fp8BlockScaleBytes(rows, cols, block_rows, block_cols));
  std::vector<float> out(rows * cols, kSentinel);
  DequantizeFp8BlockRows(codes.data(), scales.data(), cols, block_rows,
                         block_cols, 0, rows, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const uint8_t s = scales[(r / block_rows) * 3 + c / block_cols];
      ExpectRoundedOnce(out[i], ReferenceE4m3(codes[i]) * ReferenceUe8m0(s), i);
    }
  }
}

TEST(BlockFormatsTest, Fp8BlockScaleEdges) {
  // One 1 x 4 block per scale code.
  const std::vector<uint8_t> codes = {0x7E, 0x01, 0x80, 0xFE};  // 448, 2^-9,
                                                                // -0, -448
  for (int scale = 0; scale < 256; ++scale) {
    const uint8_t s = static_cast<uint8_t>(scale);
    std::vector<float> out(4, kSentinel);
    DequantizeFp8BlockRows(codes.data(), &s, 4, 1, 4, 0, 1, out.data());
    for (int c = 0; c < 4; ++c) {
      ExpectRoundedOnce(out[c], ReferenceE4m3(codes[c]) * ReferenceUe8m0(s),
                        scale * 4 + c);
    }
  }
  // Named cases: 2^-9 * 2^-127 is the fp32 subnormal 2^-136; 448 * 2^127
  // overflows to +inf; -0 keeps its sign.
  const uint8_t zero_scale = 0;
  std::vector<float> out(4);
  DequantizeFp8BlockRows(codes.data(), &zero_scale, 4, 1, 4, 0, 1, out.data());
  EXPECT_EQ(out[1], std::ldexp(1.0f, -136));
  EXPECT_EQ(out[0], 448.0f * std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::signbit(out[2]));
  const uint8_t top_scale = 254;
  DequantizeFp8BlockRows(codes.data(), &top_scale, 4, 1, 4, 0, 1, out.data());
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[3], -std::numeric_limits<float>::infinity());
}

TEST(BlockFormatsTest, RowRangesWriteOnlyTheirRows) {
  const int64_t rows = 4, cols = 32;
  std::vector<uint8_t> codes(rows * cols, 0x38);       // 1.0
  std::vector<uint8_t> packed(rows * cols / 2, 0x22);  // 1.0, 1.0
  const std::vector<uint8_t> fp8_scales = {127, 127};
  const std::vector<uint8_t> mx_scales(rows, 127);
  const std::vector<uint8_t> nv_scales(rows * 2, 0x38);
  std::vector<uint8_t> bf16(rows * cols * 2);
  for (size_t i = 0; i < bf16.size(); i += 2) {
    bf16[i] = 0x80;  // 0x3F80: 1.0
    bf16[i + 1] = 0x3F;
  }
  for (int f = 0; f < 4; ++f) {
    std::vector<float> out(rows * cols, kSentinel);
    switch (f) {
      case 0:
        DequantizeFp8BlockRows(codes.data(), fp8_scales.data(), cols, 2, 32, 1,
                               3, out.data());
        break;
      case 1:
        DequantizeMxfp4Rows(packed.data(), mx_scales.data(), cols, 1, 3,
                            out.data());
        break;
      case 2:
        DequantizeNvfp4Rows(packed.data(), nv_scales.data(), 1.0f, cols, 1, 3,
                            out.data());
        break;
      case 3:
        Bf16RowsToFloat(bf16.data(), cols, 1, 3, out.data());
        break;
    }
    for (int64_t i = 0; i < rows * cols; ++i) {
      const bool written = i >= cols && i < 3 * cols;
      EXPECT_EQ(out[i], written ? 1.0f : kSentinel)
          << "format " << f << " value " << i;
    }
  }
}

// Every byte of packed pairs (both nibbles, the even element low) against
// every UE8M0 scale code.
TEST(BlockFormatsTest, Mxfp4MatchesTheReferenceExactly) {
  const int64_t rows = 8, cols = 1024;  // 256 scales, 4096 bytes
  std::vector<uint8_t> packed(Fp4DataBytes(rows, cols));
  for (size_t i = 0; i < packed.size(); ++i) {
    packed[i] = static_cast<uint8_t>(i * 13 % 256);
  }
  std::vector<uint8_t> scales(Mxfp4ScaleBytes(rows, cols));
  ASSERT_EQ(scales.size(), 256u);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = i;
  std::vector<float> out(rows * cols, kSentinel);
  DequantizeMxfp4Rows(packed.data(), scales.data(), cols, 0, rows, out.data());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t nibble = i % 2 == 0 ? byte & 0xF : byte >> 4;
    ExpectRoundedOnce(
        out[i], ReferenceE2m1(nibble) * ReferenceUe8m0(scales[i / 32]), i);
  }
}

// Every e4m3 scale code (NaN codes included), with global scales that round
// (0.0123), are subnormal-producing, zero and overflowing.
TEST(BlockFormatsTest, Nvfp4MatchesTheReferenceExactly) {
  const int64_t rows = 4, cols = 1024;  // 256 scales
  std::vector<uint8_t> packed(Fp4DataBytes(rows, cols));
  for (size_t i = 0; i < packed.size(); ++i) {
    packed[i] = static_cast<uint8_t>(i * 29 % 256);
  }
  std::vector<uint8_t> scales(Nvfp4ScaleBytes(rows, cols));
  ASSERT_EQ(scales.size(), 256u);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = i;
  for (float global_scale : {1.0f, 0.0123f, 3.0e-38f, 0.0f, 1.0e38f, -2.5f}) {
    std::vector<float> out(rows * cols, kSentinel);
    DequantizeNvfp4Rows(packed.data(), scales.data(), global_scale, cols, 0,
                        rows, out.data());
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint8_t byte = packed[i / 2];
      const uint8_t nibble = i % 2 == 0 ? byte & 0xF : byte >> 4;
      const double e2m1 = ReferenceE2m1(nibble);
      const double scale = ReferenceE4m3(scales[i / 16]);
      // Exact in double (at most 2 + 4 + 24 significant bits); the
      // implementation's first product is exact in fp32, so it rounds once.
      const double expected = e2m1 * scale * global_scale;
      ExpectRoundedOnce(out[i], expected, i);
    }
  }
}

TEST(BlockFormatsTest, Bf16RowsMatchTheUpperHalfOfFp32) {
  const std::vector<uint16_t> values = {0x0000, 0x8000, 0x3F80, 0xC000,
                                        0x7F80, 0xFF80, 0x0001, 0x7F7F};
  std::vector<uint8_t> bytes(values.size() * 2);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  std::vector<float> out(values.size(), kSentinel);
  Bf16RowsToFloat(bytes.data(), 4, 0, 2, out.data());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t bits = uint32_t{values[i]} << 16;
    float want;
    std::memcpy(&want, &bits, 4);
    EXPECT_EQ(out[i], want) << i;
  }
}

TEST(BlockFormatsTest, FindsTheFirstNan) {
  std::vector<uint8_t> e4m3(256);
  for (int i = 0; i < 256; ++i) e4m3[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(FindE4m3Nan(e4m3.data(), 256), 0x7F);
  EXPECT_EQ(FindE4m3Nan(e4m3.data() + 0x80, 128), 0x7F);  // 0xFF
  EXPECT_EQ(FindE4m3Nan(e4m3.data(), 0x7F), -1);
  EXPECT_EQ(FindUe8m0Nan(e4m3.data(), 256), 255);
  EXPECT_EQ(FindUe8m0Nan(e4m3.data(), 255), -1);
  EXPECT_EQ(FindE4m3Nan(nullptr, 0), -1);

  const std::vector<uint16_t> bf16 = {0x7F80, 0xFF80, 0x7F7F, 0xFFC1, 0x7FC0};
  std::vector<uint8_t> bf16_bytes(bf16.size() * 2);
  std::memcpy(bf16_bytes.data(), bf16.data(), bf16_bytes.size());
  EXPECT_EQ(FindBf16Nan(bf16_bytes.data(), 5), 3);  // infinities are not NaN
  EXPECT_EQ(FindBf16Nan(bf16_bytes.data(), 3), -1);

  const std::vector<float> f32 = {std::numeric_limits<float>::infinity(), 1.0f,
                                  std::numeric_limits<float>::quiet_NaN()};
  std::vector<uint8_t> f32_bytes(f32.size() * 4);
  std::memcpy(f32_bytes.data(), f32.data(), f32_bytes.size());
  EXPECT_EQ(FindF32Nan(f32_bytes.data(), 3), 2);
  EXPECT_EQ(FindF32Nan(f32_bytes.data(), 2), -1);
}

}  // namespace
}  // namespace mneme::formats
