// The CUDA kernels' number formats (gpu/cuda/kernel_ops.h), compiled for the
// host: bit for bit the project's decoders and encoders (formats/), every
// code of the decoders and the encoders on every kind of input (codes,
// midpoints between codes, subnormals, saturation, NaN, random floats); the
// W4A4 activation op against formats/gridbook's; and the tiled Linear's and
// the tiled indexer scores' index math against the one-item ops.

#include "gpu/cuda/kernel_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
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

TEST(KernelFormatsTest, Fp16AndBf16RoundingMatch) {
  for (int bits = 0; bits < 65536; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    EXPECT_EQ(Bits(Fp16Value(h)), Bits(formats::Fp16ToFloat(h))) << bits;
  }
  std::vector<float> values;
  values.reserve(0x7C00);
  for (int bits = 0; bits < 0x7C00; ++bits) {
    values.push_back(formats::Fp16ToFloat(static_cast<uint16_t>(bits)));
  }
  for (const float x : EncoderInputs(values)) {
    EXPECT_EQ(Fp16Code(x), formats::FloatToFp16(x)) << x;
    EXPECT_EQ(Bits(RoundBf16(x)),
              Bits(formats::Bf16ToFloat(formats::FloatToBf16(x))))
        << x;
  }
}

TEST(KernelFormatsTest, Exl3CodebooksMatchEveryState) {
  namespace x3 = formats::exl3;
  for (const x3::Codebook codebook :
       {x3::Codebook::k3Inst, x3::Codebook::kMcg, x3::Codebook::kMul1}) {
    const auto& table = x3::CodebookTable(codebook);
    int64_t mismatches = 0;
    for (uint32_t state = 0; state < 65536; ++state) {
      mismatches += Bits(Exl3CodebookValue(static_cast<int32_t>(codebook),
                                           state)) != Bits(table[state]);
    }
    EXPECT_EQ(mismatches, 0) << x3::CodebookName(codebook);
  }
}

// An EXL3 weight's What through WeightView::At (DequantizeOp) is the format's
// DecodeTrellis, bit for bit, for every bit width; Hadamard128Op's lanes
// along rows and across rows are formats/exl3's transform, bit for bit (the
// same additions).
TEST(KernelFormatsTest, Exl3WeightsDecodeAsTheFormat) {
  namespace x3 = formats::exl3;
  std::mt19937 rng(3);
  const int64_t k = 256;
  const int64_t n = 128;
  for (int bits = 1; bits <= 8; ++bits) {
    for (const x3::Codebook codebook :
         {x3::Codebook::k3Inst, x3::Codebook::kMcg, x3::Codebook::kMul1}) {
      SCOPED_TRACE(::testing::Message()
                   << bits << " bits, " << x3::CodebookName(codebook));
      std::vector<uint16_t> trellis(x3::TrellisBytes(k, n, bits) / 2);
      for (uint16_t& w : trellis) w = static_cast<uint16_t>(rng());
      const std::vector<uint16_t> scales(k + n, 0x3C00);  // 1.0
      const x3::Exl3Weight weight{.in_features = k,
                                  .out_features = n,
                                  .bits = bits,
                                  .codebook = codebook,
                                  .trellis = trellis.data(),
                                  .suh = scales.data(),
                                  .svh = scales.data() + k};
      std::vector<float> what(k * n);
      x3::DecodeTrellis(weight, what.data());
      const WeightView view{
          .format = Format::kExl3,
          .rows = n,
          .cols = k,
          .data = reinterpret_cast<const uint8_t*>(trellis.data()),
          .exl3_bits = bits,
          .exl3_codebook = static_cast<int32_t>(codebook)};
      std::vector<float> got(n * k);
      const DequantizeOp op{.w = view, .out = got.data()};
      for (int64_t i = 0; i < n * k; ++i) op(i);
      int64_t mismatches = 0;
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          mismatches += Bits(got[r * k + c]) != Bits(what[c * n + r]);
        }
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
  // The transforms: rows of 256 (two blocks), then down columns of 128.
  std::vector<float> m(size_t{128} * 256);
  for (float& v : m) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<float> expected = m;
  for (int64_t r = 0; r < 128; ++r) {
    x3::Hadamard128(expected.data() + r * 256);
    x3::Hadamard128(expected.data() + r * 256 + 128);
  }
  std::vector<float> got = m;
  const Hadamard128Op along{
      .src = got.data(), .dst = got.data(), .rows = 128, .cols = 256};
  for (int64_t i = 0; i < along.Items(); ++i) along(i);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(expected[i])) << i;
  }
  // Down the columns: the transpose's rows.
  std::vector<float> column(128);
  for (int64_t c = 0; c < 256; ++c) {
    for (int64_t r = 0; r < 128; ++r) column[r] = expected[r * 256 + c];
    x3::Hadamard128(column.data());
    for (int64_t r = 0; r < 128; ++r) expected[r * 256 + c] = column[r];
  }
  const Hadamard128Op across{.src = got.data(),
                             .dst = got.data(),
                             .rows = 128,
                             .cols = 256,
                             .across_rows = true};
  for (int64_t i = 0; i < across.Items(); ++i) across(i);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(expected[i])) << i;
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
      LinearTiledOp op{.args = rows};
      op.args.y = got.data();
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

// ---- sliced decode (the warp Linear's wide loads) -------------------------

// A weight's bytes in `format` from random codes (every code, NaN included,
// when `exact` is false; else codes whose values, times x's small integers,
// add up in fp32 without rounding), 16-byte aligned, and its scales.
struct SlicedWeight {
  std::vector<Load16> data;  // aligned storage
  std::vector<uint8_t> scale;
  WeightView view;
};

SlicedWeight MakeSlicedWeight(Format format, int64_t rows, int64_t cols,
                              bool exact, std::mt19937& rng) {
  SlicedWeight s;
  int64_t bytes = 0;
  switch (format) {
    case Format::kF32:
      bytes = rows * cols * 4;
      break;
    case Format::kBf16:
      bytes = rows * cols * 2;
      break;
    case Format::kFp8Block:
      bytes = rows * cols;
      break;
    default:
      bytes = rows * cols / 2;
  }
  s.data.resize((bytes + 15) / 16);
  auto* out = reinterpret_cast<uint8_t*>(s.data.data());
  std::uniform_int_distribution<int> byte(0, 255);
  // Exact values: multiples of 1/4 up to 4 in magnitude.
  const auto exact_value = [&] {
    return static_cast<float>(
               std::uniform_int_distribution<int>(-16, 16)(rng)) /
           4.0f;
  };
  if (format == Format::kF32 || format == Format::kBf16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = exact
                          ? exact_value()
                          : std::bit_cast<float>(static_cast<uint32_t>(rng()));
      if (format == Format::kF32) {
        std::memcpy(out + 4 * i, &v, 4);
      } else {
        const uint16_t b =
            exact ? formats::FloatToBf16(v) : static_cast<uint16_t>(rng());
        std::memcpy(out + 2 * i, &b, 2);
      }
    }
  } else if (format == Format::kFp8Block) {
    for (int64_t i = 0; i < bytes; ++i) {
      out[i] =
          exact ? E4m3Code(exact_value()) : static_cast<uint8_t>(byte(rng));
    }
  } else {
    for (int64_t i = 0; i < bytes; ++i)
      out[i] = static_cast<uint8_t>(byte(rng));
  }
  s.view = WeightView{.format = format,
                      .rows = rows,
                      .cols = cols,
                      .data = reinterpret_cast<const uint8_t*>(s.data.data())};
  // Exact scales: 0.5, 1 or 2.
  const auto scale_code = [&](uint8_t one) {
    const int k = std::uniform_int_distribution<int>(0, 2)(rng);
    return exact ? static_cast<uint8_t>(one - 8 + 8 * k)  // e4m3: 8 per binade
                 : static_cast<uint8_t>(byte(rng));
  };
  switch (format) {
    case Format::kFp8Block: {
      s.view.block_rows = 128;
      s.view.block_cols = 128;
      const int64_t n = ((rows + 127) / 128) * ((cols + 127) / 128);
      for (int64_t i = 0; i < n; ++i) {
        const int k = std::uniform_int_distribution<int>(126, 128)(rng);
        s.scale.push_back(exact ? static_cast<uint8_t>(k)
                                : static_cast<uint8_t>(byte(rng)));
      }
      break;
    }
    case Format::kMxfp4:
      for (int64_t i = 0; i < rows * cols / 32; ++i) {
        const int k = std::uniform_int_distribution<int>(126, 128)(rng);
        s.scale.push_back(exact ? static_cast<uint8_t>(k)
                                : static_cast<uint8_t>(byte(rng)));
      }
      break;
    case Format::kNvfp4:
      for (int64_t i = 0; i < rows * cols / 16; ++i) {
        s.scale.push_back(scale_code(0x38));  // e4m3 1.0
      }
      s.view.global_scale = exact ? 0.5f : 0.3f;
      break;
    default:
      break;
  }
  s.view.scale = s.scale.data();
  return s;
}

template <Format F>
void ExpectSlicesDecodeAsAt(const WeightView& w) {
  constexpr int kColumns = SliceColumns(F);
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t c = 0; c < w.cols; c += kColumns) {
      float v[kColumns];
      w.DecodeSlice<F>(r, c, v);
      for (int k = 0; k < kColumns; ++k) {
        const float want = w.At(r, c + k);
        // NaN codes decode to a NaN either way.
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(v[k])) << r << "," << c + k;
        } else {
          ASSERT_EQ(Bits(v[k]), Bits(want)) << r << "," << c + k;
        }
      }
    }
  }
}

// Every slice decodes bit for bit as At decodes its elements, from any
// codes and scales, in each sliced format; rows span several FP8 scale
// blocks both ways.
TEST(LinearSlicesTest, SlicesDecodeAsAtBitForBit) {
  std::mt19937 rng(21);
  for (const bool exact : {false, true}) {
    const int64_t rows = 130;
    const int64_t cols = 512;
    SlicedWeight f32 = MakeSlicedWeight(Format::kF32, rows, cols, exact, rng);
    ASSERT_TRUE(f32.view.Sliceable());
    ExpectSlicesDecodeAsAt<Format::kF32>(f32.view);
    SlicedWeight bf16 = MakeSlicedWeight(Format::kBf16, rows, cols, exact, rng);
    ExpectSlicesDecodeAsAt<Format::kBf16>(bf16.view);
    SlicedWeight fp8 =
        MakeSlicedWeight(Format::kFp8Block, rows, cols, exact, rng);
    ASSERT_TRUE(fp8.view.Sliceable());
    ExpectSlicesDecodeAsAt<Format::kFp8Block>(fp8.view);
    SlicedWeight mx = MakeSlicedWeight(Format::kMxfp4, rows, cols, exact, rng);
    ExpectSlicesDecodeAsAt<Format::kMxfp4>(mx.view);
    SlicedWeight nv = MakeSlicedWeight(Format::kNvfp4, rows, cols, exact, rng);
    ExpectSlicesDecodeAsAt<Format::kNvfp4>(nv.view);
  }
}

// Only rows of whole slices, aligned bytes and (FP8) scale blocks of whole
// slices are sliced; EXL3 and GridBook never are; x must be aligned too.
TEST(LinearSlicesTest, FitsOnlyWholeAlignedSlices) {
  std::mt19937 rng(22);
  SlicedWeight fp8 = MakeSlicedWeight(Format::kFp8Block, 4, 256, false, rng);
  WeightView w = fp8.view;
  EXPECT_TRUE(w.Sliceable());
  w.block_cols = 8;
  EXPECT_FALSE(w.Sliceable());
  w.block_cols = 128;
  w.cols = 250;
  EXPECT_FALSE(w.Sliceable());
  w.cols = 256;
  w.data += 8;
  EXPECT_FALSE(w.Sliceable());
  SlicedWeight bf16 = MakeSlicedWeight(Format::kBf16, 4, 24, false, rng);
  EXPECT_TRUE(bf16.view.Sliceable());
  bf16.view.cols = 20;  // not whole 8-column slices
  EXPECT_FALSE(bf16.view.Sliceable());
  SlicedWeight f32 = MakeSlicedWeight(Format::kF32, 4, 36, false, rng);
  EXPECT_TRUE(f32.view.Sliceable());
  for (const Format f : {Format::kExl3, Format::kGridbook}) {
    WeightView other = f32.view;
    other.format = f;
    EXPECT_FALSE(other.Sliceable());
  }
  alignas(16) float x[64] = {};
  LinearOp op{.w = f32.view, .x = x, .tokens = 1};
  EXPECT_TRUE(LinearSlices::Fit(op));
  op.x = x + 1;
  EXPECT_FALSE(LinearSlices::Fit(op));
}

// Lane 0's value after the device's shuffle-down tree (offsets 16 to 1;
// a lane reading past the warp keeps its own value).
float ShuffleDownSum(std::vector<float> v) {
  for (int offset = kWarpLanes / 2; offset > 0; offset >>= 1) {
    for (int l = 0; l + offset < kWarpLanes; ++l) v[l] += v[l + offset];
  }
  return v[0];
}

// The warp Linear's sliced sums for every item (the lanes' Partial and the
// shuffle tree, kTokens at a time) into y.
template <Format F, int kTokens>
void RunSlicedLinear(const LinearOp& op) {
  const LinearSlices slices{op};
  for (int64_t item = 0; item < op.Items(); ++item) {
    const int n = op.ChunkTokens(item);
    for (int t0 = 0; t0 < n; t0 += kTokens) {
      const int m = std::min(n - t0, kTokens);
      std::vector<std::vector<float>> lanes(kTokens,
                                            std::vector<float>(kWarpLanes));
      for (int lane = 0; lane < kWarpLanes; ++lane) {
        float sum[kTokens] = {};
        slices.Partial<F, kTokens>(item, t0, m, lane, sum);
        for (int t = 0; t < kTokens; ++t) lanes[t][lane] = sum[t];
      }
      for (int t = 0; t < m; ++t) {
        float* out =
            op.y + (op.FirstToken(item) + t0 + t) * op.w.rows + op.Row(item);
        const float s = ShuffleDownSum(lanes[t]);
        *out = op.accumulate ? *out + s : s;
      }
    }
  }
}

template <Format F>
void ExpectSlicedLinearIsTheRowOp(std::mt19937& rng) {
  std::uniform_int_distribution<int> small(-2, 2);
  // Columns: fewer than a warp's slices, exactly one round, several rounds
  // and a partial one.
  for (const int64_t cols : {int64_t{32}, int64_t{512}, int64_t{1024 + 64}}) {
    for (const int64_t tokens : {1, 3, 4, 16, 21}) {
      SCOPED_TRACE(testing::Message()
                   << cols << " columns, " << tokens << " tokens");
      const int64_t rows = 5;
      SlicedWeight w = MakeSlicedWeight(F, rows, cols, true, rng);
      ASSERT_TRUE(w.view.Sliceable());
      std::vector<Floats4> x_storage((tokens * cols + 3) / 4);
      float* x = reinterpret_cast<float*>(x_storage.data());
      for (int64_t i = 0; i < tokens * cols; ++i) {
        x[i] = static_cast<float>(small(rng));
      }
      for (const bool accumulate : {false, true}) {
        std::vector<float> start(tokens * rows);
        for (float& v : start) v = static_cast<float>(small(rng));
        std::vector<float> want = start;
        const LinearOp rows_op{.w = w.view,
                               .x = x,
                               .y = want.data(),
                               .accumulate = accumulate,
                               .tokens = tokens};
        ASSERT_TRUE(LinearSlices::Fit(rows_op));
        for (int64_t i = 0; i < rows_op.Items(); ++i) rows_op(i);
        for (const int sums : {1, 4, 16}) {
          std::vector<float> got = start;
          LinearOp op = rows_op;
          op.y = got.data();
          if (sums == 1) RunSlicedLinear<F, 1>(op);
          if (sums == 4) RunSlicedLinear<F, 4>(op);
          if (sums == 16) RunSlicedLinear<F, 16>(op);
          // Exact values: every order of additions gives the same bits.
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(Bits(got[i]), Bits(want[i]))
                << "output " << i << ", " << sums << " sums a lane";
          }
        }
      }
    }
  }
}

// The sliced warp Linear computes what the row op computes, for every
// sliced format, 1 to 21 tokens (several passes of 1 and 4 sums, chunks of
// 16), rows of one slice up to several rounds of the warp, with and without
// accumulation: the values are exact, so a slice read twice, skipped, from
// the wrong row or with the wrong scale changes the bits.
TEST(LinearSlicesTest, WarpSumsAreTheRowOpsOnExactValues) {
  std::mt19937 rng(23);
  ExpectSlicedLinearIsTheRowOp<Format::kF32>(rng);
  ExpectSlicedLinearIsTheRowOp<Format::kBf16>(rng);
  ExpectSlicedLinearIsTheRowOp<Format::kFp8Block>(rng);
  ExpectSlicedLinearIsTheRowOp<Format::kMxfp4>(rng);
  ExpectSlicedLinearIsTheRowOp<Format::kNvfp4>(rng);
}

// The grouped layout of a MoE layer's experts (the warp's rounds of 32
// experts and their scans run lane after lane) equals its definition, an
// expert at a time: offsets and first tokens the tokens of the experts
// before, each expert in its tiles' group when TakesTiles (else its row
// op's), first items the items of the groups before in that half, then the
// sentinels; for 0 to 256 experts (rounds of one expert, whole rounds and a
// partial last one), weights of 0 to 4096 rows, and 0 to 600 tokens.
TEST(ExpertPlanOpTest, LaysOutTheGroupsAsAnExpertAtATime) {
  std::mt19937 rng(3);
  for (const int64_t experts : {0, 1, 5, 31, 32, 33, 64, 100, 256}) {
    SCOPED_TRACE(testing::Message() << experts << " experts");
    for (int trial = 0; trial < 10; ++trial) {
      std::vector<int32_t> totals(experts);
      for (int32_t& t : totals) {
        const int kind = static_cast<int>(rng() % 4);
        t = kind == 0   ? 0
            : kind == 1 ? static_cast<int32_t>(rng() % 8)
            : kind == 2 ? static_cast<int32_t>(60 + rng() % 10)
                        : static_cast<int32_t>(rng() % 600);
      }
      const int64_t groups = ExpertTableGroups(experts);
      std::vector<LinearGroup> got(kExpertTables * groups);
      const int64_t rows[] = {0, 64, 127, 128, 2048, 4096};
      for (int64_t j = 0; j < kExpertTables; ++j) {
        for (int64_t e = 0; e < experts; ++e) {
          got[j * groups + e].w.rows = rows[rng() % 6];
          got[j * groups + e].w.cols = 64;
        }
      }
      std::vector<int64_t> offsets(experts + 1, -5);
      const ExpertPlanOp op{
          .totals = totals.data(),
          .experts = experts,
          .offsets = offsets.data(),
          .tables = {got.data(), got.data() + groups, got.data() + 2 * groups}};
      for (int64_t j = kExpertTables - 1; j >= 0; --j) op(j);
      for (int64_t j = 0; j < kExpertTables; ++j) {
        const LinearGroup* by_rows = got.data() + j * groups;
        const LinearGroup* by_tiles = by_rows + experts + 1;
        int64_t tokens = 0;
        int64_t row_items = 0;
        int64_t tile_items = 0;
        for (int64_t e = 0; e <= experts; ++e) {
          SCOPED_TRACE(testing::Message() << "table " << j << ", expert " << e);
          if (j == 0) {
            ASSERT_EQ(offsets[e], tokens);
          }
          ASSERT_EQ(by_rows[e].first_token, tokens);
          ASSERT_EQ(by_tiles[e].first_token, tokens);
          ASSERT_EQ(by_rows[e].first_item, row_items);
          ASSERT_EQ(by_tiles[e].first_item, tile_items);
          const int64_t n = e < experts ? totals[e] : 0;
          const LinearOp linear{.w = by_rows[e].w, .tokens = n};
          const bool tiles =
              n > 0 && linear.w.rows > 0 && TakesTiles(n, linear.w.rows);
          ASSERT_EQ(by_rows[e].tokens, tiles ? 0 : n);
          ASSERT_EQ(by_tiles[e].tokens, tiles ? n : 0);
          if (tiles) {
            tile_items += LinearTiledOp{.args = linear}.Tiles();
          } else if (n > 0) {
            row_items += linear.Items();
          }
          tokens += n;
        }
      }
    }
  }
}

// Sparse attention by blocks (the block's phases run thread after thread,
// then warp after warp) equals SparseAttentionWarpOp bit for bit, the
// output and the log-sum-exp of every (query, head), and writes nothing
// past them: heads fewer than a block's, more and not a multiple of it,
// key lists shorter than a tile, ragged tiles, missing (-1) and repeated
// keys, a query without keys, head dimensions of 1 to 512, with and
// without the sink.
TEST(SparseAttentionBlockOpTest, EqualsTheWarpOpBitForBit) {
  struct Shape {
    int64_t heads, hd, tokens, width;
  };
  const std::vector<Shape> shapes = {
      {1, 1, 1, 1},     {3, 33, 2, 7},   {8, 128, 2, 8}, {13, 64, 3, 17},
      {64, 512, 1, 40}, {16, 512, 2, 0}, {9, 100, 2, 9}};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int trial = 0; trial < 2 * static_cast<int>(shapes.size()); ++trial) {
    const Shape shape = shapes[trial % shapes.size()];
    const bool with_sink = trial >= static_cast<int>(shapes.size());
    SCOPED_TRACE(testing::Message()
                 << shape.heads << " heads of " << shape.hd << ", "
                 << shape.tokens << " queries of " << shape.width << " keys"
                 << (with_sink ? ", sink" : ""));
    const int64_t keys = 23;
    std::vector<float> q(shape.tokens * shape.heads * shape.hd);
    std::vector<float> kv(keys * shape.hd);
    std::vector<float> sink(shape.heads);
    for (float& v : q) v = 4.0f * value(rng);
    for (float& v : kv) v = value(rng);
    for (float& v : sink) v = value(rng);
    std::vector<int32_t> idx(shape.tokens * shape.width);
    std::uniform_int_distribution<int32_t> row(-1, keys - 1);
    for (int32_t& r : idx) r = row(rng);
    if (!idx.empty()) idx[idx.size() / 2] = idx[0];  // a repeated key
    // The last query has no keys.
    if (shape.tokens > 1) {
      std::fill(idx.end() - shape.width, idx.end(), -1);
    }
    const int64_t outputs = shape.tokens * shape.heads * shape.hd;
    const int64_t lses = shape.tokens * shape.heads;
    constexpr int64_t kGuard = 64;
    std::vector<float> want_out(outputs), want_lse(lses);
    SparseAttentionWarpOp warp{
        .args = {.q = q.data(),
                 .kv = kv.data(),
                 .idx = idx.data(),
                 .width = shape.width,
                 .heads = shape.heads,
                 .hd = shape.hd,
                 .scale = 0.3f,
                 .sink = with_sink ? sink.data() : nullptr,
                 .out = want_out.data(),
                 .lse = want_lse.data()}};
    for (int64_t i = 0; i < lses; ++i) warp(i);
    std::vector<float> got_out(outputs + kGuard, std::nanf(""));
    std::vector<float> got_lse(lses + kGuard, std::nanf(""));
    std::fill(got_out.begin() + outputs, got_out.end(), 7.0f);
    std::fill(got_lse.begin() + lses, got_lse.end(), 7.0f);
    SparseAttentionBlockOp block{
        .warp = warp,
        .block_heads = static_cast<int32_t>(
            std::min<int64_t>(shape.heads, kAttentionBlockHeads))};
    block.warp.args.out = got_out.data();
    block.warp.args.lse = got_lse.data();
    for (int64_t g = shape.tokens * block.Groups() - 1; g >= 0; --g) block(g);
    for (int64_t i = 0; i < outputs + kGuard; ++i) {
      const float want = i < outputs ? want_out[i] : 7.0f;
      ASSERT_EQ(Bits(got_out[i]), Bits(want)) << "output " << i;
    }
    for (int64_t i = 0; i < lses + kGuard; ++i) {
      const float want = i < lses ? want_lse[i] : 7.0f;
      ASSERT_EQ(Bits(got_lse[i]), Bits(want)) << "log-sum-exp " << i;
    }
  }
}

// A split goes in ranges of whole tiles, at least kAttentionSplitMinKeys
// keys each, that cover the list with none empty, and only while the blocks
// are fewer than kAttentionSplitBlocks, bringing them up to about that.
TEST(SparseAttentionSplitTest, RangesOfWholeTilesCoverTheList) {
  for (int64_t blocks = 0; blocks <= 2 * kAttentionSplitBlocks; ++blocks) {
    for (int64_t width = 0; width <= 3000; width += 7) {
      const AttentionSplit split = ChooseAttentionSplit(blocks, width);
      const bool splits = blocks > 0 && blocks < kAttentionSplitBlocks &&
                          width >= 2 * kAttentionSplitMinKeys;
      ASSERT_EQ(split.splits > 1, splits) << blocks << " " << width;
      if (!splits) {
        ASSERT_EQ(split.splits, 1);
        continue;
      }
      ASSERT_EQ(split.split_keys % kAttentionTileKeys, 0);
      ASSERT_GE(split.split_keys, kAttentionSplitMinKeys);
      ASSERT_LT((split.splits - 1) * split.split_keys, width);
      ASSERT_GE(split.splits * split.split_keys, width);
      ASSERT_LT(blocks * split.splits, kAttentionSplitBlocks + blocks);
    }
  }
  // V4-Flash decode: 64 heads (8 blocks of 8) over 128 + 512 keys.
  const AttentionSplit v4 = ChooseAttentionSplit(8, 640);
  EXPECT_EQ(v4.splits, 10);
  EXPECT_EQ(v4.split_keys, 64);
}

// The merge on hand-made ranges: empty ranges weigh nothing, a (query,
// head) with no key gives zeros and -inf, and a NaN range makes it NaN (as
// a NaN score does in the unsplit op), whatever the other ranges hold.
TEST(SparseAttentionSplitTest, MergeSkipsEmptyRangesAndPassesNaNOn) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::nanf("");
  struct Case {
    std::vector<float> lse;  // per range
    float want_lse;
    float want_out0;
  };
  // Range s's output holds s + 1 in every dimension.
  const std::vector<Case> cases = {
      {{-inf, -inf, -inf}, -inf, 0.0f},
      {{-inf, 0.5f, -inf}, 0.5f, 2.0f},
      {{0.0f, 0.0f, -inf}, std::log(2.0f), 1.5f},
      {{nan, 0.5f, 1.0f}, nan, nan},
      {{-inf, -inf, nan}, nan, nan},
  };
  constexpr int kSplits = 3;
  constexpr int64_t kHd = 4;
  for (const Case& c : cases) {
    std::vector<float> part_out(kSplits * kHd);
    for (int s = 0; s < kSplits; ++s) {
      std::fill_n(part_out.begin() + s * kHd, kHd, static_cast<float>(s + 1));
    }
    std::vector<float> out(kHd, 7.0f);
    float lse = 7.0f;
    const SparseAttentionMergeOp merge{.part_out = part_out.data(),
                                       .part_lse = c.lse.data(),
                                       .splits = kSplits,
                                       .heads = 1,
                                       .hd = kHd,
                                       .out = out.data(),
                                       .lse = &lse};
    for (int64_t i = 0; i < kHd; ++i) merge(i);
    if (std::isnan(c.want_lse)) {
      EXPECT_TRUE(std::isnan(lse));
      for (const float v : out) EXPECT_TRUE(std::isnan(v));
    } else {
      EXPECT_FLOAT_EQ(lse, c.want_lse);
      for (const float v : out) EXPECT_FLOAT_EQ(v, c.want_out0);
    }
  }
}

// Split attention (the blocks over ranges of each list, then the merge)
// gives the whole list's output and log-sum-exp (the unsplit block op's)
// within float rounding, with and without the sink; a query without keys
// gives zeros and -inf, and so does a range without keys inside a query
// that has some (it weighs nothing); nothing past the outputs is written.
TEST(SparseAttentionSplitTest, MergedRangesAreTheWholeList) {
  struct Shape {
    int64_t heads, hd, tokens, width, split_keys;
  };
  const std::vector<Shape> shapes = {{64, 512, 1, 640, 64},
                                     {16, 512, 2, 300, 64},
                                     {3, 33, 3, 70, 8},
                                     {9, 100, 2, 129, 16},
                                     {1, 1, 1, 9, 8}};
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int trial = 0; trial < 2 * static_cast<int>(shapes.size()); ++trial) {
    const Shape shape = shapes[trial % shapes.size()];
    const bool with_sink = trial >= static_cast<int>(shapes.size());
    const auto splits = static_cast<int32_t>(
        (shape.width + shape.split_keys - 1) / shape.split_keys);
    SCOPED_TRACE(testing::Message()
                 << shape.heads << " heads of " << shape.hd << ", "
                 << shape.tokens << " queries of " << shape.width << " keys, "
                 << splits << " ranges" << (with_sink ? ", sink" : ""));
    const int64_t keys = 700;
    std::vector<float> q(shape.tokens * shape.heads * shape.hd);
    std::vector<float> kv(keys * shape.hd);
    std::vector<float> sink(shape.heads);
    for (float& v : q) v = 4.0f * value(rng);
    for (float& v : kv) v = value(rng);
    for (float& v : sink) v = value(rng);
    std::vector<int32_t> idx(shape.tokens * shape.width);
    std::uniform_int_distribution<int32_t> row(-1, keys - 1);
    for (int32_t& r : idx) r = row(rng);
    // Query 0's first range has no keys; the last query (of several) none.
    std::fill_n(idx.begin(), std::min(shape.split_keys, shape.width), -1);
    if (shape.tokens > 1) {
      std::fill(idx.end() - shape.width, idx.end(), -1);
    }
    const int64_t outputs = shape.tokens * shape.heads * shape.hd;
    const int64_t lses = shape.tokens * shape.heads;
    std::vector<float> want_out(outputs), want_lse(lses);
    SparseAttentionBlockOp whole{
        .warp = {.args = {.q = q.data(),
                          .kv = kv.data(),
                          .idx = idx.data(),
                          .width = shape.width,
                          .heads = shape.heads,
                          .hd = shape.hd,
                          .scale = 0.3f,
                          .sink = with_sink ? sink.data() : nullptr,
                          .out = want_out.data(),
                          .lse = want_lse.data()}},
        .block_heads = static_cast<int32_t>(
            std::min<int64_t>(shape.heads, kAttentionBlockHeads))};
    for (int64_t b = 0; b < whole.Blocks(shape.tokens); ++b) whole(b);

    constexpr int64_t kGuard = 64;
    const int64_t parts = lses * splits;
    std::vector<float> part_out(parts * shape.hd + kGuard, std::nanf(""));
    std::vector<float> part_lse(parts + kGuard, std::nanf(""));
    std::vector<float> got_out(outputs + kGuard, std::nanf(""));
    std::vector<float> got_lse(lses + kGuard, std::nanf(""));
    for (std::vector<float>* v : {&part_out, &part_lse, &got_out, &got_lse}) {
      std::fill(v->end() - kGuard, v->end(), 7.0f);
    }
    SparseAttentionBlockOp split = whole;
    split.splits = splits;
    split.split_keys = shape.split_keys;
    split.part_out = part_out.data();
    split.part_lse = part_lse.data();
    split.warp.args.out = nullptr;  // the ranges write only their parts
    split.warp.args.lse = nullptr;
    ASSERT_EQ(split.Blocks(shape.tokens), whole.Blocks(shape.tokens) * splits);
    for (int64_t b = split.Blocks(shape.tokens) - 1; b >= 0; --b) split(b);
    const SparseAttentionMergeOp merge{
        .part_out = part_out.data(),
        .part_lse = part_lse.data(),
        .splits = splits,
        .heads = shape.heads,
        .hd = shape.hd,
        .sink = with_sink ? sink.data() : nullptr,
        .out = got_out.data(),
        .lse = got_lse.data()};
    for (int64_t i = outputs - 1; i >= 0; --i) merge(i);

    for (int64_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(part_out[parts * shape.hd + i], 7.0f);
      ASSERT_EQ(part_lse[parts + i], 7.0f);
      ASSERT_EQ(got_out[outputs + i], 7.0f);
      ASSERT_EQ(got_lse[lses + i], 7.0f);
    }
    // Query 0's first range: no keys, zeros and -inf.
    ASSERT_EQ(part_lse[0], -std::numeric_limits<float>::infinity());
    ASSERT_EQ(part_out[0], 0.0f);
    for (int64_t i = 0; i < lses; ++i) {
      if (std::isinf(want_lse[i])) {
        ASSERT_EQ(got_lse[i], want_lse[i]) << "log-sum-exp " << i;
      } else {
        ASSERT_NEAR(got_lse[i], want_lse[i], 1e-5f * std::abs(want_lse[i]))
            << "log-sum-exp " << i;
      }
    }
    for (int64_t i = 0; i < outputs; ++i) {
      ASSERT_NEAR(got_out[i], want_out[i], 1e-5f) << "output " << i;
    }
    if (shape.tokens > 1) {
      for (int64_t i = outputs - shape.heads * shape.hd; i < outputs; ++i) {
        ASSERT_EQ(got_out[i], 0.0f);
      }
    }
  }
}

// The tiled indexer scores (the block's phases run thread after thread)
// write every score once and nothing past it, equal to IndexScoresOp up to
// the order of the sum over the heads: NaN where it has NaN, the same
// infinities, finite values within rounding. Key columns past d hold NaN
// (never read); some cases put NaN, infinities and 1e30 in the inputs, some
// of those give each query its own rows, some of them -1 (a score of 0,
// whatever the weights).
TEST(IndexScoresTiledOpTest, WritesEveryScoreOnceAsIndexScoresOp) {
  struct Shape {
    int64_t heads, d, tokens, n;
  };
  std::vector<Shape> shapes = {{64, 128, 2, 150}, {70, 33, 3, 65},
                               {1, 1, 1, 1},      {16, 128, 1, 64},
                               {5, 7, 3, 200},    {80, 100, 1, 129}};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const auto kinds = static_cast<int>(shapes.size());
  for (int trial = 0; trial < 3 * kinds; ++trial) {
    const Shape shape = shapes[trial % shapes.size()];
    const bool specials = trial >= kinds;
    const bool per_query = trial >= 2 * kinds;
    SCOPED_TRACE(testing::Message() << shape.heads << " heads of " << shape.d
                                    << ", " << shape.tokens << " x " << shape.n
                                    << (specials ? ", with NaN / inf" : "")
                                    << (per_query ? ", rows per query" : ""));
    const int64_t key_cols = shape.d + 3;
    const int64_t pool_rows = shape.n + 2;
    std::vector<float> q(shape.tokens * shape.heads * shape.d);
    std::vector<float> w(shape.tokens * shape.heads);
    std::vector<float> pool(pool_rows * key_cols, std::nanf(""));
    for (float& v : q) v = value(rng);
    for (float& v : w) v = value(rng);
    for (int64_t r = 0; r < pool_rows; ++r) {
      for (int64_t c = 0; c < shape.d; ++c) pool[r * key_cols + c] = value(rng);
    }
    if (specials) {
      q[0] = std::nanf("");
      q[q.size() / 2] = inf;
      w[w.size() - 1] = -inf;
      pool[key_cols + shape.d - 1] = 1e30f;
    }
    std::vector<int32_t> rows(per_query ? shape.tokens * shape.n : shape.n);
    std::uniform_int_distribution<int32_t> row(
        per_query ? -1 : 0, static_cast<int32_t>(pool_rows - 1));
    for (int32_t& r : rows) r = row(rng);
    const int64_t outputs = shape.tokens * shape.n;
    constexpr int64_t kGuard = 64;
    std::vector<float> want(outputs);
    const IndexScoresOp one{.q = q.data(),
                            .w = w.data(),
                            .keys = pool.data(),
                            .key_cols = key_cols,
                            .rows = rows.data(),
                            .rows_stride = per_query ? shape.n : 0,
                            .n = shape.n,
                            .heads = shape.heads,
                            .d = shape.d,
                            .out = want.data()};
    for (int64_t i = 0; i < outputs; ++i) one(i);
    std::vector<float> got(outputs + kGuard, std::nanf(""));
    std::fill(got.begin() + outputs, got.end(), 7.0f);
    IndexScoresTiledOp tiled{.args = one};
    tiled.args.out = got.data();
    const int64_t tiles = shape.tokens * tiled.EntryTiles();
    for (int64_t tile = tiles - 1; tile >= 0; --tile) tiled(tile);
    for (int64_t i = outputs; i < outputs + kGuard; ++i) {
      ASSERT_EQ(got[i], 7.0f) << "written past the scores at " << i;
    }
    for (int64_t i = 0; i < outputs; ++i) {
      const int64_t t = i / shape.n;
      const int64_t j = i % shape.n;
      const int32_t r = one.Row(t, j);
      if (r < 0) {
        ASSERT_EQ(want[i], 0.0f) << "score " << i;
        ASSERT_EQ(got[i], 0.0f) << "score " << i;
        continue;
      }
      double magnitude = 0.0;
      for (int64_t h = 0; h < shape.heads; ++h) {
        double dot = 0.0;
        for (int64_t c = 0; c < shape.d; ++c) {
          dot += std::fabs(double{q[(t * shape.heads + h) * shape.d + c]} *
                           pool[r * key_cols + c]);
        }
        magnitude += std::fabs(double{w[t * shape.heads + h]}) * dot;
      }
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << "score " << i << ": " << got[i];
      } else if (std::isinf(want[i])) {
        ASSERT_EQ(got[i], want[i]) << "score " << i;
      } else {
        ASSERT_NEAR(got[i], want[i], 1e-5 * magnitude + 1e-30) << "score " << i;
      }
    }
  }
}

}  // namespace
}  // namespace mneme::gpu::kernels
