#include "tools/quant/nvfp4_quant.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "gtest/gtest.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::quant {
namespace {

using formats::E2m1ToFloat;
using formats::E4m3ToFloat;
using formats::FloatToE4m3;

// FP8-representable heavy-tailed rows, as the quantizer sees them.
std::vector<float> Fp8Rows(int layer, int64_t first, int64_t count) {
  std::vector<float> values(count * 256);
  std::vector<float> row(256);
  std::vector<uint8_t> fp8(264);
  for (int64_t r = 0; r < count; ++r) {
    synthetic::SyntheticRowValues(9, layer, first + r, absl::MakeSpan(row));
    EXPECT_TRUE(formats::EncodeFp8Row(row, absl::MakeSpan(fp8)).ok());
    EXPECT_TRUE(
        formats::DecodeRowsF32({.format = formats::RowFormat::kFp8}, fp8,
                               absl::MakeSpan(values).subspan(r * 256, 256))
            .ok());
  }
  return values;
}

// Squared block error, computed here from the definition in double.
double ReferenceError(const float* x, uint8_t scale, float gs) {
  const double step = static_cast<double>(E4m3ToFloat(scale)) * gs;
  double sum = 0;
  for (int i = 0; i < 16; ++i) {
    // Nearest e2m1 magnitude of x / step (ties are irrelevant to the error).
    double best = 0;
    if (step > 0) {
      double best_d = 1e300;
      for (int code = 0; code < 16; ++code) {
        const double q = E2m1ToFloat(code) * step;
        if (std::fabs(q - x[i]) < best_d) {
          best_d = std::fabs(q - x[i]);
          best = q;
        }
      }
    }
    sum += (x[i] - best) * (x[i] - best);
  }
  return sum;
}

TEST(QuantMethodTest, NamesRoundTrip) {
  for (const char* name : {"gptq-mse", "gptq-amax", "rtn-mse", "rtn-amax"}) {
    absl::StatusOr<QuantMethod> method = ParseQuantMethod(name);
    ASSERT_TRUE(method.ok()) << name;
    EXPECT_EQ(QuantMethodName(*method), name);
  }
  EXPECT_EQ(ParseQuantMethod("gptq").status().code(),
            absl::StatusCode::kInvalidArgument);
  const QuantMethod fallback;
  EXPECT_EQ(QuantMethodName(fallback), "gptq-mse");
}

TEST(PackCodesTest, EvenElementInTheLowNibble) {
  uint8_t codes[256];
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i % 16);
  uint8_t packed[128];
  PackCodes(codes, packed);
  EXPECT_EQ(packed[0], 0x10);
  EXPECT_EQ(packed[1], 0x32);
  EXPECT_EQ(packed[7], 0xFE);
  EXPECT_EQ(packed[8], 0x10);
}

TEST(QuantizeRowRtnTest, KnownBlockEncodesBitExactly) {
  // Global scale 1: block amax 6 -> scale 1.0 (e4m3 0x38); values are then
  // their own e2m1 codes.
  std::vector<float> row(256, 0.0f);
  const float block0[16] = {6, 3,     -1.5f, 0.5f, 0,  -6, 2,  4,
                            1, -0.5f, 1.5f,  -3,   -4, -2, -1, 0.25f};
  std::copy(block0, block0 + 16, row.begin());
  uint8_t weights[128], scales[16];
  QuantizeRowRtn(row.data(), 1.0f, ScaleChoice::kAmax, weights, scales);
  EXPECT_EQ(scales[0], 0x38);
  const uint8_t want[8] = {0x57, 0x1B, 0xF0, 0x64, 0x92, 0xD3, 0xCE, 0x0A};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(weights[j], want[j]) << j;
  // All-zero blocks: scale 0, codes 0.
  EXPECT_EQ(scales[1], 0x00);
  EXPECT_EQ(weights[8], 0x00);
}

TEST(QuantizeRowRtnTest, AmaxIsBitIdenticalToEncodeNvfp4Row) {
  const std::vector<float> rows = Fp8Rows(1, 0, 400);
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  for (int r = 0; r < 400; ++r) {
    const float* x = rows.data() + int64_t{r} * 256;
    uint8_t w1[128], s1[16], w2[128], s2[16];
    QuantizeRowRtn(x, gs, ScaleChoice::kAmax, w1, s1);
    ASSERT_TRUE(formats::EncodeNvfp4Row(absl::MakeConstSpan(x, 256), gs,
                                        absl::MakeSpan(w2), absl::MakeSpan(s2))
                    .ok());
    ASSERT_EQ(0, std::memcmp(w1, w2, 128)) << "row " << r;
    ASSERT_EQ(0, std::memcmp(s1, s2, 16)) << "row " << r;
  }
}

TEST(ChooseBlockScaleTest, MseIsTheArgminOverTheRoundedCandidates) {
  const std::vector<float> rows = Fp8Rows(3, 100, 300);
  const float gs = formats::Nvfp4GlobalScale(24.0f);
  int64_t blocks = 0, smaller = 0;
  for (size_t b = 0; b < rows.size() / 16; ++b) {
    const float* x = rows.data() + b * 16;
    float amax = 0;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = amax / 6.0f / gs;
    const uint8_t hi = FloatToE4m3(s);
    const uint8_t lo = FloatToE4m3(0.75f * s);
    bool chose_smaller = false;
    const uint8_t mse =
        ChooseBlockScale(x, gs, ScaleChoice::kMse, &chose_smaller);
    const uint8_t amax_scale = ChooseBlockScale(x, gs, ScaleChoice::kAmax);
    EXPECT_EQ(amax_scale, hi);
    ASSERT_GE(mse, std::max<uint8_t>(lo, 1));
    ASSERT_LE(mse, hi);
    const double chosen = ReferenceError(x, mse, gs);
    for (int code = std::max<int>(lo, 1); code <= hi; ++code) {
      const double e = ReferenceError(x, static_cast<uint8_t>(code), gs);
      // Nothing strictly better; equals only below the choice (the largest
      // of the minima wins).
      EXPECT_GE(e, chosen * (1 - 1e-12)) << "block " << b << " code " << code;
      if (code > mse) {
        EXPECT_GT(e, chosen * (1 - 1e-12));
      }
    }
    EXPECT_LE(chosen, ReferenceError(x, amax_scale, gs));
    EXPECT_EQ(chose_smaller, mse != hi);
    ++blocks;
    smaller += chose_smaller;
  }
  // "About a third of blocks pick a smaller scale" (QUANT.md).
  EXPECT_GT(smaller, blocks / 10);
  EXPECT_LT(smaller, blocks * 2 / 3);
}

TEST(ChooseBlockScaleTest, BlockErrorMatchesTheDecoderArithmetic) {
  const std::vector<float> rows = Fp8Rows(1, 7, 20);
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  for (size_t b = 0; b < rows.size() / 16; ++b) {
    const float* x = rows.data() + b * 16;
    const uint8_t scale = ChooseBlockScale(x, gs, ScaleChoice::kMse);
    // The decoder rounds each value to fp32 once; the reference is double.
    EXPECT_NEAR(BlockSquaredError(x, scale, gs), ReferenceError(x, scale, gs),
                1e-6 * ReferenceError(x, scale, gs) + 1e-20);
  }
}

TEST(ChooseBlockScaleTest, TinyBlocksUnderflowToAZeroScale) {
  // Block amax far below global_scale * 2^-10: the e4m3 scale rounds to 0
  // and every code is 0, with either choice.
  std::vector<float> row(256, 0.0f);
  row[3] = 1e-9f;
  for (ScaleChoice choice : {ScaleChoice::kAmax, ScaleChoice::kMse}) {
    uint8_t weights[128], scales[16];
    QuantizeRowRtn(row.data(), 1.0f, choice, weights, scales);
    EXPECT_EQ(scales[0], 0);
    EXPECT_EQ(weights[1], 0);
  }
}

TEST(QuantizeRowRtnTest, MseNeverWorsePerBlockThanAmax) {
  const std::vector<float> rows = Fp8Rows(1, 5000, 200);
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  RowQuantStats stats;
  for (int r = 0; r < 200; ++r) {
    const float* x = rows.data() + int64_t{r} * 256;
    uint8_t wa[128], sa[16], wm[128], sm[16];
    QuantizeRowRtn(x, gs, ScaleChoice::kAmax, wa, sa);
    QuantizeRowRtn(x, gs, ScaleChoice::kMse, wm, sm, &stats);
    std::vector<float> da(256), dm(256);
    std::vector<uint8_t> raw(144);
    std::copy(wa, wa + 128, raw.begin());
    std::copy(sa, sa + 16, raw.begin() + 128);
    ASSERT_TRUE(formats::DecodeRowsF32(
                    {.format = formats::RowFormat::kNvfp4, .global_scale = gs},
                    raw, absl::MakeSpan(da))
                    .ok());
    std::copy(wm, wm + 128, raw.begin());
    std::copy(sm, sm + 16, raw.begin() + 128);
    ASSERT_TRUE(formats::DecodeRowsF32(
                    {.format = formats::RowFormat::kNvfp4, .global_scale = gs},
                    raw, absl::MakeSpan(dm))
                    .ok());
    for (int b = 0; b < 16; ++b) {
      double ea = 0, em = 0;
      for (int i = b * 16; i < b * 16 + 16; ++i) {
        ea += (da[i] - x[i]) * static_cast<double>(da[i] - x[i]);
        em += (dm[i] - x[i]) * static_cast<double>(dm[i] - x[i]);
      }
      EXPECT_LE(em, ea) << "row " << r << " block " << b;
    }
  }
  EXPECT_GT(stats.smaller_scale_blocks, 0);
}

}  // namespace
}  // namespace mneme::quant
