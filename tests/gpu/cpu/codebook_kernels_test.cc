#include "gpu/cpu/codebook_kernels.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "formats/bf16.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/hwy_targets.h"

// The codebook kernels on every Highway target the CPU supports (each forced
// in turn): decoding is the formats' reference values bit for bit, products
// are double-precision sums of those values up to fp32 rounding.

namespace mneme::gpu::codebook_kernels {
namespace {

namespace gb = formats::gridbook;
namespace x3 = formats::exl3;

struct Exl3Test {
  int64_t in = 0;
  int64_t out = 0;
  std::vector<uint16_t> trellis;
  std::vector<uint16_t> scales;  // suh then svh
  PackedMatrix Packed(int bits, x3::Codebook codebook) const {
    return {.format = WeightFormat::kExl3,
            .rows = out,
            .cols = in,
            .data = reinterpret_cast<const uint8_t*>(trellis.data()),
            .scale = reinterpret_cast<const uint8_t*>(scales.data()),
            .exl3_bits = bits,
            .exl3_codebook = codebook};
  }
};

Exl3Test MakeExl3(int64_t in, int64_t out, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  Exl3Test w;
  w.in = in;
  w.out = out;
  w.trellis.resize(static_cast<size_t>(in * out * bits / 16));
  for (uint16_t& word : w.trellis) word = static_cast<uint16_t>(rng());
  w.scales.resize(static_cast<size_t>(in + out));
  for (uint16_t& s : w.scales) {
    s = formats::FloatToFp16((rng() % 2 != 0 ? -1.0f : 1.0f) * u(rng));
  }
  return w;
}

std::vector<float> Random(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = u(rng);
  return values;
}

// Checks y = x W^T (W rows x cols, row-major, the reference values) for rows
// [begin, end), with the rows outside keeping `fill`.
void ExpectProduct(const std::vector<float>& dense, int64_t rows, int64_t cols,
                   const std::vector<float>& x, int64_t tokens, int64_t begin,
                   int64_t end, const std::vector<float>& y, int64_t ldy,
                   bool accumulate, float fill) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const float got = y[t * ldy + r];
      if (r < begin || r >= end) {
        ASSERT_EQ(got, fill) << "row " << r << " outside the range written";
        continue;
      }
      double sum = accumulate ? fill : 0.0;
      double magnitude = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const double term =
            static_cast<double>(x[t * cols + c]) * dense[r * cols + c];
        sum += term;
        magnitude += std::fabs(term);
      }
      ASSERT_NEAR(got, sum, 1e-5 * magnitude + 1e-6)
          << "token " << t << " row " << r;
    }
  }
}

class CodebookKernelsTest : public ::mneme::testing::HwyTargetTest {};

TEST_P(CodebookKernelsTest, DispatchesToTheForcedTarget) {
  EXPECT_STREQ(SimdTargetName(), hwy::TargetName(GetParam()));
}

TEST_P(CodebookKernelsTest, Exl3ProductsMatchTheDequantizedWeight) {
  uint32_t seed = 1;
  for (const x3::Codebook codebook :
       {x3::Codebook::k3Inst, x3::Codebook::kMcg, x3::Codebook::kMul1}) {
    for (int bits = x3::kMinBits; bits <= x3::kMaxBits; ++bits) {
      const int64_t in = bits % 2 == 0 ? 256 : 128;
      const int64_t out = 384;
      const Exl3Test w = MakeExl3(in, out, bits, seed++);
      const PackedMatrix packed = w.Packed(bits, codebook);
      // The reference: the formats' dequantized rows (scalar decoding).
      std::vector<float> dense(static_cast<size_t>(in * out));
      x3::DequantizeOutputRows({.in_features = in,
                                .out_features = out,
                                .bits = bits,
                                .codebook = codebook,
                                .trellis = w.trellis.data(),
                                .suh = w.scales.data(),
                                .svh = w.scales.data() + in},
                               0, out, dense.data());
      // Exl3DecodeRows of one block is those rows, bit for bit.
      std::vector<float> rows(static_cast<size_t>(128 * in));
      Exl3DecodeRows(packed, 128, 256, rows.data());
      for (int64_t i = 0; i < 128 * in; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(rows[i]),
                  std::bit_cast<uint32_t>(dense[128 * in + i]))
            << "K " << bits << " value " << i;
      }
      for (const int64_t tokens : {1, 2, 5, 16}) {
        SCOPED_TRACE(::testing::Message()
                     << x3::CodebookName(codebook) << " K " << bits << ", "
                     << tokens << " tokens");
        const std::vector<float> x = Random(tokens * in, seed++);
        std::vector<float> xp(static_cast<size_t>(2 * tokens * in));
        Exl3TransformInput(packed, x.data(), tokens, xp.data());
        const int64_t ldy = out + 5;
        for (const bool accumulate : {false, true}) {
          std::vector<float> y(static_cast<size_t>(tokens * ldy), 0.25f);
          // Blocks 1 and 2 only: block 0 keeps its value.
          Exl3OutputBlocks(packed, xp.data(), tokens, 1, 3, y.data(), ldy,
                           accumulate);
          ExpectProduct(dense, out, in, x, tokens, 128, out, y, ldy, accumulate,
                        0.25f);
        }
      }
    }
  }
}

struct GridbookTest {
  gb::Scheme scheme;
  gb::Codebooks books;
  std::vector<uint8_t> data;
  std::vector<float> row_scales;
  int64_t rows = 0;
  int64_t cols = 0;
  PackedMatrix Packed() const {
    return {.format = WeightFormat::kGridbook,
            .rows = rows,
            .cols = cols,
            .data = data.data(),
            .scale = reinterpret_cast<const uint8_t*>(row_scales.data()),
            .gridbook_scheme = scheme,
            .gridbook_books = &books};
  }
};

GridbookTest MakeGridbook(const char* format, gb::ScaleCoding coding,
                          int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  GridbookTest w;
  w.rows = rows;
  w.cols = cols;
  auto scheme = gb::SchemeForFormat(format, coding);
  EXPECT_TRUE(scheme.ok()) << scheme.status();
  w.scheme = *scheme;
  for (int sub = 0; sub < w.scheme.n_sub; ++sub) {
    w.books.tables[sub].resize(static_cast<size_t>(
        gb::SubTableRows(w.scheme, sub) * gb::SubTableColumns(w.scheme)));
    for (float& v : w.books.tables[sub]) {
      v = formats::Bf16ToFloat(formats::FloatToBf16(normal(rng)));
    }
  }
  w.data.resize(static_cast<size_t>(rows * (cols / gb::kSuperblock) *
                                    gb::TypeSize(w.scheme)));
  for (uint8_t& b : w.data) b = static_cast<uint8_t>(rng());
  if (w.scheme.scale_coding == gb::ScaleCoding::kE4m3) {
    // e4m3 group scales of 0.5 .. 2 (no NaN codes).
    const int type_size = gb::TypeSize(w.scheme);
    const int plane = gb::kCodewordsPerSuperblock * w.scheme.k / 8;
    for (size_t s = 0; s < w.data.size(); s += type_size) {
      for (int g = 0; g < 16; ++g) {
        w.data[s + plane + g] = static_cast<uint8_t>(0x30 + rng() % 16);
      }
    }
  } else if (w.scheme.scale_coding == gb::ScaleCoding::kTwoTier) {
    const int type_size = gb::TypeSize(w.scheme);
    const int plane = gb::kCodewordsPerSuperblock * w.scheme.k / 8;
    for (size_t s = 0; s < w.data.size(); s += type_size) {
      w.data[s + plane] = static_cast<uint8_t>(120 + rng() % 8);
    }
  }
  w.row_scales.resize(static_cast<size_t>(rows));
  for (float& s : w.row_scales) s = 0.01f + 0.001f * (rng() % 100);
  return w;
}

TEST_P(CodebookKernelsTest, GridbookRowsAndProductsMatchTheReference) {
  uint32_t seed = 300;
  const struct {
    const char* format;
    gb::ScaleCoding coding;
  } cases[] = {{"NVFP4_CB_K16", gb::ScaleCoding::kTwoTier},
               {"NVFP4_CB_K13", gb::ScaleCoding::kE4m3},
               {"NVFP4_CB_S12", gb::ScaleCoding::kTwoTier},
               {"FP8_CB_K36", gb::ScaleCoding::kNone},
               {"FP8_CB_K29", gb::ScaleCoding::kNone}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.format);
    const int64_t rows = 21;
    const int64_t cols = 512;
    const GridbookTest w = MakeGridbook(c.format, c.coding, rows, cols, seed++);
    const PackedMatrix packed = w.Packed();
    // The reference values: the scalar superblock decoder.
    std::vector<float> dense(static_cast<size_t>(rows * cols));
    const int64_t blocks = cols / gb::kSuperblock;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t s = 0; s < blocks; ++s) {
        gb::DecodeSuperblock(
            w.scheme, w.books,
            w.data.data() + (r * blocks + s) * gb::TypeSize(w.scheme),
            w.row_scales[r], dense.data() + r * cols + s * gb::kSuperblock);
      }
    }
    std::vector<float> decoded(static_cast<size_t>((rows - 3) * cols) + 8,
                               9.0f);
    GridbookDecodeRows(packed, 2, rows - 1, decoded.data());
    for (int64_t i = 0; i < (rows - 3) * cols; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(decoded[i]),
                std::bit_cast<uint32_t>(dense[2 * cols + i]))
          << "value " << i;
    }
    for (size_t i = (rows - 3) * cols; i < decoded.size(); ++i) {
      ASSERT_EQ(decoded[i], 9.0f) << "written past the end";
    }
    for (const int64_t tokens : {1, 2, 17}) {
      SCOPED_TRACE(::testing::Message() << tokens << " tokens");
      const std::vector<float> x = Random(tokens * cols, seed++);
      const int64_t ldy = rows + 2;
      for (const bool accumulate : {false, true}) {
        std::vector<float> y(static_cast<size_t>(tokens * ldy), -3.0f);
        GridbookDotRows(packed, x.data(), tokens, 1, rows, y.data(), ldy,
                        accumulate);
        ExpectProduct(dense, rows, cols, x, tokens, 1, rows, y, ldy, accumulate,
                      -3.0f);
      }
    }
    // A unit vector picks one value of each row: exactly that value.
    for (const int64_t column : {int64_t{0}, int64_t{255}, int64_t{300}}) {
      std::vector<float> x(static_cast<size_t>(cols), 0.0f);
      x[column] = 1.0f;
      std::vector<float> y(static_cast<size_t>(rows));
      GridbookDotRows(packed, x.data(), 1, 0, rows, y.data(), rows, false);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(y[r], dense[r * cols + column])
            << "row " << r << " column " << column;
      }
    }
  }
}

MNEME_INSTANTIATE_HWY_TARGETS(CodebookKernelsTest);

}  // namespace
}  // namespace mneme::gpu::codebook_kernels
