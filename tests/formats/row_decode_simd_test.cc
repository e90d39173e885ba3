// The SIMD decoders equal the scalar reference bit for bit, on every Highway
// target this binary carries that the CPU supports (each is forced in turn).

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/row_decode.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/hwy_targets.h"

namespace mneme::formats {
namespace {

// `num_rows` rows of random bytes whose first weight bytes and first scale
// bytes run through all 256 values, so that (given enough rows) every e4m3,
// e2m1 pair and UE8M0 code occurs as a weight and as a scale: NaN, zero,
// subnormal and overflowing ones included.
std::vector<uint8_t> EdgeRows(RowFormat format, size_t num_rows,
                              uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t row_bytes = RowBytes(format);
  const size_t weight_bytes = RowWeightBytes(format);
  const size_t scale_bytes = RowScaleBytes(format);
  std::vector<uint8_t> rows(num_rows * row_bytes);
  for (uint8_t& b : rows) b = static_cast<uint8_t>(rng());
  for (size_t value = 0; value < 256; ++value) {
    const size_t w_row = value / weight_bytes;
    const size_t s_row = value / scale_bytes;
    if (w_row < num_rows) {
      rows[w_row * row_bytes + value % weight_bytes] =
          static_cast<uint8_t>(value);
    }
    if (s_row < num_rows) {
      rows[s_row * row_bytes + weight_bytes + value % scale_bytes] =
          static_cast<uint8_t>(value);
    }
  }
  return rows;
}

uint32_t Bits(float value) { return std::bit_cast<uint32_t>(value); }
uint16_t Bits(uint16_t value) { return value; }

// Equal bits element by element; names the first difference.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& scalar,
                                    const std::vector<T>& simd) {
  if (scalar.size() != simd.size()) {
    return ::testing::AssertionFailure() << "sizes differ";
  }
  for (size_t i = 0; i < scalar.size(); ++i) {
    if (Bits(scalar[i]) != Bits(simd[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << " (row " << i / kRowDim << ", value "
             << i % kRowDim << "): scalar " << scalar[i] << " simd " << simd[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class RowDecodeSimdTest : public ::mneme::testing::HwyTargetTest {
 protected:
  // Decodes `rows` with both impls to both outputs and compares the bits.
  void ExpectSimdMatchesScalar(RowFormat format, float global_scale,
                               const std::vector<uint8_t>& rows) {
    const size_t num_rows = rows.size() / RowBytes(format);
    RowDecodeOptions options{.format = format, .global_scale = global_scale};
    std::vector<float> scalar(num_rows * kRowDim);
    std::vector<float> simd(num_rows * kRowDim);
    std::vector<uint16_t> scalar_bf16(num_rows * kRowDim);
    std::vector<uint16_t> simd_bf16(num_rows * kRowDim);
    options.impl = DecodeImpl::kScalar;
    ASSERT_TRUE(DecodeRowsF32(options, rows, absl::MakeSpan(scalar)).ok());
    ASSERT_TRUE(
        DecodeRowsBf16(options, rows, absl::MakeSpan(scalar_bf16)).ok());
    options.impl = DecodeImpl::kSimd;
    // Poison the outputs so that a value the SIMD path skips shows up.
    std::fill(simd.begin(), simd.end(), 12345.0f);
    std::fill(simd_bf16.begin(), simd_bf16.end(), 0x1234);
    ASSERT_TRUE(DecodeRowsF32(options, rows, absl::MakeSpan(simd)).ok());
    ASSERT_TRUE(DecodeRowsBf16(options, rows, absl::MakeSpan(simd_bf16)).ok());
    ASSERT_TRUE(SameBits(scalar, simd));
    ASSERT_TRUE(SameBits(scalar_bf16, simd_bf16));
  }
};

TEST_P(RowDecodeSimdTest, DispatchesToTheForcedTarget) {
  EXPECT_EQ(std::string(DecodeSimdTargetName()), hwy::TargetName(GetParam()));
}

TEST_P(RowDecodeSimdTest, Fp8MatchesScalar) {
  for (const size_t num_rows : {1, 2, 3, 17, 64}) {
    SCOPED_TRACE(num_rows);
    ExpectSimdMatchesScalar(RowFormat::kFp8, 1.0f,
                            EdgeRows(RowFormat::kFp8, num_rows, num_rows));
  }
}

TEST_P(RowDecodeSimdTest, Nvfp4MatchesScalar) {
  const float kGlobalScales[] = {
      1.0f,
      0.004092f,
      0.008929f,
      0.0f,
      1e-30f,  // products become fp32 subnormals
      std::numeric_limits<float>::denorm_min(),
      3e36f,  // products overflow to inf
      std::numeric_limits<float>::max(),
  };
  for (const size_t num_rows : {1, 2, 3, 17, 64}) {
    for (const float global_scale : kGlobalScales) {
      SCOPED_TRACE(::testing::Message()
                   << num_rows << " rows, global scale " << global_scale);
      ExpectSimdMatchesScalar(RowFormat::kNvfp4, global_scale,
                              EdgeRows(RowFormat::kNvfp4, num_rows, num_rows));
    }
  }
}

TEST_P(RowDecodeSimdTest, ManyRandomRows) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> log_scale(-40.0f, 40.0f);
  for (int trial = 0; trial < 20; ++trial) {
    const float global_scale = std::pow(10.0f, log_scale(rng));
    for (const RowFormat format : {RowFormat::kFp8, RowFormat::kNvfp4}) {
      SCOPED_TRACE(::testing::Message() << RowFormatName(format) << " trial "
                                        << trial << " gs " << global_scale);
      ExpectSimdMatchesScalar(format, global_scale,
                              EdgeRows(format, 100, 1000 + trial));
    }
  }
}

MNEME_INSTANTIATE_HWY_TARGETS(RowDecodeSimdTest);

}  // namespace
}  // namespace mneme::formats
