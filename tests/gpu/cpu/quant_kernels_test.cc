#include "gpu/cpu/quant_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/backend.h"
#include "gpu/host_weight.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/hwy_targets.h"

namespace mneme::gpu::quant_kernels {
namespace {

// A random weight in one format with valid (non-NaN) codes and scales, and
// its exact fp32 values from gpu/host_weight.h (formats/block_formats.h).
struct TestWeight {
  HostWeight host;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scale;
  std::vector<float> values;

  PackedMatrix Packed() const {
    return PackedMatrix{.format = host.format,
                        .rows = host.rows,
                        .cols = host.cols,
                        .data = data.data(),
                        .scale = scale.data(),
                        .block_rows = host.block_rows,
                        .block_cols = host.block_cols,
                        .global_scale = host.global_scale};
  }
};

uint8_t RandomE4m3(std::mt19937& rng) {
  for (;;) {
    const auto code = static_cast<uint8_t>(rng());
    if ((code & 0x7F) != 0x7F) return code;  // not NaN
  }
}

TestWeight MakeWeight(WeightFormat format, int64_t rows, int64_t cols,
                      uint32_t seed, int block_rows = 128,
                      int block_cols = 128) {
  std::mt19937 rng(seed);
  TestWeight w;
  w.host.format = format;
  w.host.rows = rows;
  w.host.cols = cols;
  w.host.block_rows = block_rows;
  w.host.block_cols = block_cols;
  // UE8M0 scales around 2^0 (112..142), and now and then a tiny one (down
  // to 2^-127: subnormal products) or a large one (up to 2^33).
  auto ue8m0 = [&rng]() -> uint8_t {
    if (rng() % 16 == 0) return static_cast<uint8_t>(rng() % 161);
    return static_cast<uint8_t>(112 + rng() % 31);
  };
  switch (format) {
    case WeightFormat::kBf16:
      w.data.resize(static_cast<size_t>(rows * cols * 2));
      for (size_t i = 0; i < w.data.size(); i += 2) {
        // Sign, mantissa, and an exponent field of 100..154 or (now and
        // then) 0: zeros and subnormals.
        const uint32_t exponent = rng() % 16 == 0 ? 0 : 100 + rng() % 55;
        const uint16_t bits =
            static_cast<uint16_t>((rng() & 0x807F) | (exponent << 7));
        std::memcpy(&w.data[i], &bits, 2);
      }
      break;
    case WeightFormat::kFp8Block: {
      w.data.resize(static_cast<size_t>(rows * cols));
      for (uint8_t& b : w.data) b = RandomE4m3(rng);
      const int64_t scales = ((rows + block_rows - 1) / block_rows) *
                             ((cols + block_cols - 1) / block_cols);
      w.scale.resize(static_cast<size_t>(scales));
      for (uint8_t& s : w.scale) s = ue8m0();
      break;
    }
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4: {
      w.data.resize(static_cast<size_t>(rows * cols / 2));
      for (uint8_t& b : w.data) b = static_cast<uint8_t>(rng());
      const int64_t group = format == WeightFormat::kMxfp4 ? 32 : 16;
      w.scale.resize(static_cast<size_t>(rows * cols / group));
      for (uint8_t& s : w.scale) {
        s = format == WeightFormat::kMxfp4 ? ue8m0() : RandomE4m3(rng);
      }
      if (format == WeightFormat::kNvfp4) w.host.global_scale = 0.0123f;
      break;
    }
    default:
      break;
  }
  w.host.data = w.data;
  w.host.scale = w.scale;
  absl::StatusOr<std::vector<float>> values = DequantizeHostWeight(w.host);
  EXPECT_TRUE(values.ok()) << values.status();
  if (values.ok()) w.values = *std::move(values);
  return w;
}

struct Shape {
  WeightFormat format;
  int64_t rows;
  int64_t cols;
  int block_rows;
  int block_cols;
};

// Column counts around every vector length, the fp8 blocks, the fp4 groups
// and the 512-column tile of the kernels.
std::vector<Shape> Shapes() {
  std::vector<Shape> shapes;
  for (int64_t cols : {1, 3, 8, 17, 64, 129, 511, 512, 513, 1030}) {
    shapes.push_back({WeightFormat::kBf16, 5, cols, 0, 0});
    shapes.push_back({WeightFormat::kFp8Block, 5, cols, 128, 128});
    shapes.push_back({WeightFormat::kFp8Block, 9, cols, 4, 3});
  }
  shapes.push_back({WeightFormat::kFp8Block, 70, 300, 32, 32});
  for (int64_t cols : {32, 64, 96, 480, 512, 544, 1056}) {
    shapes.push_back({WeightFormat::kMxfp4, 5, cols, 0, 0});
    shapes.push_back({WeightFormat::kNvfp4, 5, cols, 0, 0});
  }
  for (int64_t cols : {16, 48, 528}) {
    shapes.push_back({WeightFormat::kNvfp4, 3, cols, 0, 0});
  }
  return shapes;
}

std::string Describe(const Shape& s) {
  return std::string(WeightFormatName(s.format)) + " " +
         std::to_string(s.rows) + " x " + std::to_string(s.cols) +
         (s.format == WeightFormat::kFp8Block
              ? " blocks " + std::to_string(s.block_rows) + " x " +
                    std::to_string(s.block_cols)
              : "");
}

// Every test runs once per Highway target the CPU supports (the Arm suites
// in tests/arm run it for NEON, SVE and SVE2 too).
class QuantKernelsTest : public ::mneme::testing::HwyTargetTest {};

TEST_P(QuantKernelsTest, DispatchesToTheForcedTarget) {
  EXPECT_STREQ(SimdTargetName(), hwy::TargetName(GetParam()));
}

TEST_P(QuantKernelsTest, DecodeRowsMatchesTheScalarDequantizationBitForBit) {
  uint32_t seed = 1;
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(Describe(shape));
    const TestWeight w = MakeWeight(shape.format, shape.rows, shape.cols,
                                    seed++, shape.block_rows, shape.block_cols);
    // Row ranges from the first, the middle and up to the last row, and
    // single rows; a canary after the output catches a write past its end.
    const int64_t rows = shape.rows;
    for (const auto& [begin, end] :
         std::vector<std::pair<int64_t, int64_t>>{{0, rows},
                                                  {1, rows},
                                                  {0, rows - 1},
                                                  {rows / 2, rows / 2 + 1},
                                                  {rows - 1, rows}}) {
      if (begin >= end) continue;
      SCOPED_TRACE(::testing::Message() << "rows " << begin << " to " << end);
      const size_t n = static_cast<size_t>((end - begin) * shape.cols);
      std::vector<float> out(n + 16, 12345.0f);
      DecodeRows(w.Packed(), begin, end, out.data());
      for (size_t i = n; i < out.size(); ++i) {
        ASSERT_EQ(out[i], 12345.0f) << "written past the end";
      }
      for (size_t i = 0; i < n; ++i) {
        const float expected = w.values[begin * shape.cols + i];
        uint32_t a = 0, b = 0;
        std::memcpy(&a, &out[i], 4);
        std::memcpy(&b, &expected, 4);
        ASSERT_EQ(a, b) << "row "
                        << begin + static_cast<int64_t>(i) / shape.cols
                        << " col " << static_cast<int64_t>(i) % shape.cols
                        << ": " << out[i] << " vs " << expected;
      }
    }
  }
}

// x = a unit vector picks one weight value out of each row: the product is
// that value exactly (every other term is an exact zero), whatever the
// scales of the other groups - so a wrong value in any group shows, on the
// one-token path (decoded in registers) and the tile path (two tokens).
TEST_P(QuantKernelsTest, DotRowsOfUnitVectorsAreTheValuesExactly) {
  uint32_t seed = 50;
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(Describe(shape));
    const TestWeight w = MakeWeight(shape.format, shape.rows, shape.cols,
                                    seed++, shape.block_rows, shape.block_cols);
    const int64_t step = std::max<int64_t>(1, shape.cols / 97);
    for (int64_t c = 0; c < shape.cols; c += step) {
      for (int64_t tokens : {1, 2}) {
        std::vector<float> x(static_cast<size_t>(tokens * shape.cols), 0.0f);
        for (int64_t t = 0; t < tokens; ++t) x[t * shape.cols + c] = 1.0f;
        std::vector<float> y(static_cast<size_t>(tokens * shape.rows));
        DotRows(w.Packed(), x.data(), tokens, 0, shape.rows, y.data(),
                shape.rows, false);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < shape.rows; ++r) {
            ASSERT_EQ(y[t * shape.rows + r], w.values[r * shape.cols + c])
                << "row " << r << " col " << c << ", " << tokens << " tokens";
          }
        }
      }
    }
  }
}

TEST_P(QuantKernelsTest, DotRowsMatchesDoubleSumsOfTheDequantizedValues) {
  uint32_t seed = 100;
  for (const Shape& shape : Shapes()) {
    const TestWeight w = MakeWeight(shape.format, shape.rows, shape.cols,
                                    seed++, shape.block_rows, shape.block_cols);
    for (int64_t tokens : {1, 2, 5, 16, 17}) {
      SCOPED_TRACE(Describe(shape) + ", " + std::to_string(tokens) + " tokens");
      std::mt19937 rng(seed++);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(tokens * shape.cols));
      for (float& v : x) v = u(rng);
      // y has a wider stride than the rows, and rows [1, rows) only are
      // computed: the others must keep their value.
      const int64_t ldy = shape.rows + 3;
      for (const bool accumulate : {false, true}) {
        std::vector<float> y(static_cast<size_t>(tokens * ldy), 7.0f);
        DotRows(w.Packed(), x.data(), tokens, 1, shape.rows, y.data(), ldy,
                accumulate);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < ldy; ++r) {
            const float got = y[t * ldy + r];
            if (r == 0 || r >= shape.rows) {
              ASSERT_EQ(got, 7.0f) << "token " << t << " row " << r;
              continue;
            }
            double sum = accumulate ? 7.0 : 0.0;
            double magnitude = accumulate ? 7.0 : 0.0;
            for (int64_t c = 0; c < shape.cols; ++c) {
              const double p =
                  double{x[t * shape.cols + c]} * w.values[r * shape.cols + c];
              sum += p;
              magnitude += std::abs(p);
            }
            // n unit roundoffs of the magnitude (fp32 sums in any order).
            const double tolerance =
                (static_cast<double>(shape.cols) + 2) * 0x1p-24 * magnitude +
                1e-30;
            ASSERT_NEAR(got, sum, tolerance) << "token " << t << " row " << r
                                             << " accumulate " << accumulate;
          }
        }
      }
    }
  }
}

MNEME_INSTANTIATE_HWY_TARGETS(QuantKernelsTest);

}  // namespace
}  // namespace mneme::gpu::quant_kernels
