// The CUDA kernels' number formats (gpu/cuda/kernel_ops.h), compiled for the
// host: bit for bit the project's decoders and encoders (formats/), every
// code of the decoders and the encoders on every kind of input (codes,
// midpoints between codes, subnormals, saturation, NaN, random floats); the
// W4A4 activation op against formats/gridbook's; and the tiled Linear's
// index math against LinearOp.

#include "gpu/cuda/kernel_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/gridbook/gridbook.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"

namespace mneme::gpu::kernels {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(KernelFormatsTest, DecodersMatchEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const auto c = static_cast<uint8_t>(code);
    EXPECT_EQ(Bits(E4m3Value(c)), Bits(formats::E4m3ToFloat(c))) << code;
    EXPECT_EQ(Bits(Ue8m0Value(c)), Bits(formats::Ue8m0ToFloat(c))) << code;
    // Only the low nibble counts.
    EXPECT_EQ(Bits(E2m1Value(c)), Bits(formats::E2m1ToFloat(c & 0xF))) << code;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const auto bits = static_cast<uint16_t>(rng());
    EXPECT_EQ(Bits(Bf16Value(bits)), Bits(formats::Bf16ToFloat(bits))) << bits;
  }
}

// Inputs that reach every branch of an encoder with `codes` values: each
// value, its neighbours one ulp away, the midpoints to the next value (the
// ties) and around them, both signs; plus random floats of every magnitude.
std::vector<float> EncoderInputs(const std::vector<float>& values) {
  std::vector<float> in;
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    for (const float x : {v, std::nextafter(v, inf), std::nextafter(v, -inf)}) {
      in.push_back(x);
      in.push_back(-x);
    }
    if (i + 1 < values.size()) {
      const float mid = (v + values[i + 1]) / 2.0f;
      for (const float x :
           {mid, std::nextafter(mid, inf), std::nextafter(mid, -inf)}) {
        in.push_back(x);
        in.push_back(-x);
      }
    }
  }
  for (const float x :
       {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::max(), 1e-30f, 1e30f}) {
    in.push_back(x);
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    in.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  }
  return in;
}

TEST(KernelFormatsTest, E4m3EncoderMatches) {
  std::vector<float> values;
  values.reserve(0x7F);
  for (int code = 0; code < 0x7F; ++code) {
    values.push_back(formats::E4m3ToFloat(static_cast<uint8_t>(code)));
  }
  for (const float x : EncoderInputs(values)) {
    EXPECT_EQ(E4m3Code(x), formats::FloatToE4m3(x)) << x;
  }
}

TEST(KernelFormatsTest, E2m1EncoderMatches) {
  std::vector<float> values;
  values.reserve(8);
  for (int code = 0; code < 8; ++code) {
    values.push_back(formats::E2m1ToFloat(static_cast<uint8_t>(code)));
  }
  for (const float x : EncoderInputs(values)) {
    EXPECT_EQ(E2m1Code(x), formats::FloatToE2m1(x)) << x;
  }
}

TEST(KernelFormatsTest, W4A4ActivationsMatchGridbook) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Groups of every kind: random, all zero, one large outlier, tiny values
  // whose scale underflows, values at the e2m1 midpoints.
  std::vector<float> x;
  for (int g = 0; g < 400; ++g) {
    for (int i = 0; i < 16; ++i) {
      float v = normal(rng) * std::ldexp(1.0f, g % 40 - 20);
      if (g % 7 == 1) v = 0.0f;
      if (g % 7 == 2 && i == 3) v = 1e4f;
      if (g % 7 == 3) v = 0.25f * static_cast<float>(i % 8) - 1.0f;
      x.push_back(v);
    }
  }
  for (const float global_scale : {1.0f, 0.37f, 448.0f * 6.0f / 3.0f}) {
    std::vector<float> want(x.size());
    formats::gridbook::QuantizeActivationsW4A4(
        x.data(), static_cast<int64_t>(x.size()), global_scale, want.data(),
        nullptr, nullptr);
    std::vector<float> got(x.size());
    const QuantizeW4A4Op op{
        .x = x.data(), .xq = got.data(), .global_scale = global_scale};
    for (int64_t g = 0; g < static_cast<int64_t>(x.size()) / 16; ++g) op(g);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(Bits(got[i]), Bits(want[i])) << i << " scale " << global_scale;
    }
  }
}

// The tiled Linear (its block's phases run thread after thread) writes every
// output of y once and nothing else, each the sum LinearOp computes in the
// same order (so bit for bit), in any order of the tiles: one tile exactly,
// shapes ragged in every direction, fewer rows, tokens or columns than a
// tile, with and without accumulation.
TEST(LinearTiledOpTest, WritesEveryOutputOnceAsLinearOp) {
  struct Shape {
    int64_t tokens, rows, cols;
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (const Shape& shape :
       {Shape{32, 64, 32}, Shape{33, 65, 33}, Shape{70, 130, 100},
        Shape{16, 1, 1}, Shape{17, 3, 200}, Shape{100, 7, 31}}) {
    SCOPED_TRACE(testing::Message() << shape.tokens << " tokens, " << shape.rows
                                    << "x" << shape.cols);
    std::vector<float> weight(shape.rows * shape.cols);
    std::vector<float> x(shape.tokens * shape.cols);
    for (float& v : weight) v = value(rng);
    for (float& v : x) v = value(rng);
    const WeightView w{.format = Format::kF32,
                       .rows = shape.rows,
                       .cols = shape.cols,
                       .data = reinterpret_cast<const uint8_t*>(weight.data())};
    const int64_t outputs = shape.tokens * shape.rows;
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
      // y is followed by a guard that no tile may touch.
      constexpr int64_t kGuard = 64;
      std::vector<float> start(outputs + kGuard);
      for (float& v : start) v = value(rng);
      std::vector<float> want = start;
      const LinearOp rows{.w = w,
                          .x = x.data(),
                          .y = want.data(),
                          .accumulate = accumulate,
                          .tokens = shape.tokens};
      EXPECT_EQ(rows.Items(), (shape.tokens + kLinearRowTokens - 1) /
                                  kLinearRowTokens * shape.rows);
      for (int64_t i = 0; i < rows.Items(); ++i) rows(i);
      std::vector<float> got = start;
      if (!accumulate) std::fill_n(got.begin(), outputs, std::nanf(""));
      const LinearTiledOp op{.w = w,
                             .x = x.data(),
                             .y = got.data(),
                             .accumulate = accumulate,
                             .tokens = shape.tokens};
      const int64_t tiles = op.Tiles();
      EXPECT_EQ(tiles, (shape.rows + kTileRows - 1) / kTileRows *
                           ((shape.tokens + kTileTokens - 1) / kTileTokens));
      for (int64_t tile = tiles - 1; tile >= 0; --tile) op(tile);
      for (int64_t i = 0; i < outputs + kGuard; ++i) {
        ASSERT_EQ(Bits(got[i]), Bits(want[i]))
            << "output " << i << " (token " << i / shape.rows << ", row "
            << i % shape.rows << ")";
      }
    }
  }
}

}  // namespace
}  // namespace mneme::gpu::kernels
