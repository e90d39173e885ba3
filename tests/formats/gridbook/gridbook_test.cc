// GridBook decode properties that hold without the reference: the SPEC's
// worked example, the type sizes of the published ladders, codeword
// extraction, the scale planes and scheme validation.

#include "formats/gridbook/gridbook.h"

#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/hwy_targets.h"

namespace mneme::formats::gridbook {
namespace {

Scheme MustScheme(const char* format, ScaleCoding coding) {
  auto scheme = SchemeForFormat(format, coding);
  EXPECT_TRUE(scheme.ok()) << scheme.status();
  return scheme.ok() ? *scheme : Scheme{};
}

TEST(GridbookScheme, TypeSizesOfTheLadders) {
  struct Row {
    const char* format;
    int v2;
    int v1;
  };
  for (const Row& row :
       {Row{"NVFP4_CB_K12", 57, 64}, Row{"NVFP4_CB_K14", 65, 72},
        Row{"NVFP4_CB_K16", 73, 80}, Row{"NVFP4_CB_K18", 81, 88}}) {
    EXPECT_EQ(TypeSize(MustScheme(row.format, ScaleCoding::kTwoTier)), row.v2)
        << row.format;
    EXPECT_EQ(TypeSize(MustScheme(row.format, ScaleCoding::kE4m3)), row.v1)
        << row.format;
  }
  EXPECT_EQ(TypeSize(MustScheme("FP8_CB_K28", ScaleCoding::kNone)), 112);
  EXPECT_EQ(TypeSize(MustScheme("FP8_CB_K36", ScaleCoding::kNone)), 144);
  EXPECT_EQ(TypeSize(MustScheme("FP8_CB_K44", ScaleCoding::kNone)), 176);
  EXPECT_EQ(TypeSize(MustScheme("FP8_CB_K48", ScaleCoding::kNone)), 192);
}

TEST(GridbookScheme, OddBitCountsSplitLargerFirst) {
  const Scheme k13 = MustScheme("NVFP4_CB_K13", ScaleCoding::kTwoTier);
  EXPECT_EQ(BitWidth(k13, 0), 7);
  EXPECT_EQ(BitWidth(k13, 1), 6);
  const Scheme k29 = MustScheme("FP8_CB_K29", ScaleCoding::kNone);
  EXPECT_EQ(BitWidth(k29, 0), 8);
  EXPECT_EQ(BitWidth(k29, 1), 7);
  EXPECT_EQ(BitWidth(k29, 3), 7);
  EXPECT_EQ(SubTableColumns(k29), 2);
  const Scheme s12 = MustScheme("NVFP4_CB_S12", ScaleCoding::kTwoTier);
  EXPECT_EQ(SubTableRows(s12, 0), 16);
  EXPECT_EQ(SubTableColumns(s12), 8);
}

TEST(GridbookScheme, RefusesWhatItCannotServe) {
  EXPECT_EQ(
      SchemeForFormat("INT4_CB_K12", ScaleCoding::kTwoTier).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SchemeForFormat("NVFP4_CB_K", ScaleCoding::kTwoTier).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SchemeForFormat("NVFP4_CB_K12", ScaleCoding::kNone).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SchemeForFormat("FP8_CB_K80", ScaleCoding::kNone).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SchemeForFormat("NVFP4_CB_S30", ScaleCoding::kTwoTier).status().code(),
      absl::StatusCode::kInvalidArgument);
  Scheme scheme = MustScheme("FP8_CB_K28", ScaleCoding::kNone);
  scheme.scale_coding = ScaleCoding::kE4m3;
  EXPECT_EQ(ValidateScheme(scheme).code(), absl::StatusCode::kInvalidArgument);
  // Eight one-value sub-tables divide the codeword, but no artifact holds
  // more than four tables (and Codebooks has room for four).
  Scheme eight = MustScheme("FP8_CB_K32", ScaleCoding::kNone);
  eight.n_sub = 8;
  EXPECT_EQ(ValidateScheme(eight).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GridbookCodewords, LsbFirstAcrossBytes) {
  std::mt19937 rng(9);
  for (const int k : {12, 13, 16, 28, 29, 48}) {
    std::vector<uint64_t> expected(kCodewordsPerSuperblock);
    std::vector<uint8_t> block(size_t{4} * k, 0);
    for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
      expected[v] = (static_cast<uint64_t>(rng()) << 32 | rng()) &
                    ((uint64_t{1} << k) - 1);
      for (int b = 0; b < k; ++b) {
        const int bit = v * k + b;
        block[bit / 8] |=
            static_cast<uint8_t>(((expected[v] >> b) & 1u) << (bit % 8));
      }
    }
    std::vector<uint64_t> codewords(kCodewordsPerSuperblock);
    ExtractCodewords(block.data(), k, codewords.data());
    EXPECT_EQ(codewords, expected) << "k " << k;
  }
}

// SPEC section 2: NVFP4_CB_K12, sub-indices (5, 3) make codeword
// 5 | 3 << 6 = 197; its 8 values are sub0[5] then sub1[3].
TEST(GridbookDecode, WorkedExample) {
  const Scheme scheme = MustScheme("NVFP4_CB_K12", ScaleCoding::kE4m3);
  Codebooks books;
  for (int sub = 0; sub < 2; ++sub) {
    books.tables[sub].assign(size_t{64} * 4, 0.0f);
  }
  const float sub0_row5[4] = {0.5f, -1.0f, 6.0f, 0.0f};
  const float sub1_row3[4] = {-3.0f, 1.5f, 2.0f, -0.5f};
  for (int j = 0; j < 4; ++j) {
    books.tables[0][5 * 4 + j] = sub0_row5[j];
    books.tables[1][3 * 4 + j] = sub1_row3[j];
  }
  ASSERT_TRUE(ValidateCodebooks(scheme, books).ok());
  std::vector<uint8_t> block(TypeSize(scheme), 0);
  // Codeword 0 = 197 (12 bits: bytes 0 and the low nibble of byte 1).
  block[0] = 197 & 0xFF;
  block[1] = 197 >> 8;
  for (int g = 0; g < 16; ++g) {
    block[48 + g] = FloatToE4m3(g == 0 ? 0.75f : 1.0f);
  }
  float out[kSuperblock];
  DecodeSuperblock(scheme, books, block.data(), 0.0f, out);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out[j], sub0_row5[j] * 0.75f);
    EXPECT_EQ(out[4 + j], sub1_row3[j] * 0.75f);
  }
}

TEST(GridbookDecode, TwoTierScalesAndFp8RowScale) {
  const Scheme scheme = MustScheme("NVFP4_CB_K12", ScaleCoding::kTwoTier);
  Codebooks books;
  books.tables[0].assign(size_t{64} * 4, 1.0f);
  books.tables[1].assign(size_t{64} * 4, -2.0f);
  std::vector<uint8_t> block(TypeSize(scheme), 0);
  block[48] = 127 + 3;           // 2^3
  block[49] = 0x9 | (0x2 << 4);  // group 0: T[9] = 2.25, group 1: T[2] = 1.25
  float out[kSuperblock];
  DecodeSuperblock(scheme, books, block.data(), 0.0f, out);
  EXPECT_EQ(out[0], 1.0f * 2.25f * 8.0f);
  EXPECT_EQ(out[4], -2.0f * 2.25f * 8.0f);
  EXPECT_EQ(out[16], 1.0f * 1.25f * 8.0f);
  EXPECT_EQ(out[32], 1.0f * 1.0f * 8.0f);  // group 2: index 0

  const Scheme fp8 = MustScheme("FP8_CB_K28", ScaleCoding::kNone);
  Codebooks fp8_books;
  for (int sub = 0; sub < 4; ++sub) {
    fp8_books.tables[sub].assign(size_t{128} * 2, 448.0f);
  }
  std::vector<uint8_t> fp8_block(TypeSize(fp8), 0);
  DecodeSuperblock(fp8, fp8_books, fp8_block.data(), 1.0f / 3.0f, out);
  // bf16(f32(448 * f32(1/3))), rounded to nearest even.
  EXPECT_EQ(out[0], Bf16ToFloat(FloatToBf16(448.0f * (1.0f / 3.0f))));
}

TEST(GridbookCodebooks, SizeAndFiniteness) {
  const Scheme scheme = MustScheme("NVFP4_CB_K14", ScaleCoding::kTwoTier);
  Codebooks books;
  books.tables[0].assign(size_t{128} * 4, 0.5f);
  books.tables[1].assign(size_t{127} * 4, 0.5f);
  EXPECT_EQ(ValidateCodebooks(scheme, books).code(),
            absl::StatusCode::kInvalidArgument);
  books.tables[1].assign(size_t{128} * 4, 0.5f);
  EXPECT_TRUE(ValidateCodebooks(scheme, books).ok());
  books.tables[1][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ValidateCodebooks(scheme, books).code(),
            absl::StatusCode::kDataLoss);
}

// The SIMD superblock decoder equals the scalar reference bit for bit on
// every Highway target this binary carries that the CPU supports (each forced
// in turn): every mode, sub-table count and scale coding, random tables and
// superblocks, fp8 row scales that overflow bf16 and one that is NaN.
class GridbookSimdTest : public ::mneme::testing::HwyTargetTest {};

TEST_P(GridbookSimdTest, SuperblockDecodeMatchesTheScalarReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<Scheme> schemes;
  for (const char* format :
       {"NVFP4_CB_K12", "NVFP4_CB_K15", "NVFP4_CB_K18", "NVFP4_CB_S9",
        "NVFP4_CB_S14", "FP8_CB_K28", "FP8_CB_K37", "FP8_CB_K48"}) {
    for (const ScaleCoding coding :
         {ScaleCoding::kE4m3, ScaleCoding::kTwoTier}) {
      schemes.push_back(MustScheme(format, coding));
    }
  }
  // An artifact's own two-tier table, with values that are not bf16 values:
  // the products are rounded to bf16 by the contract.
  Scheme own_table = MustScheme("NVFP4_CB_K14", ScaleCoding::kTwoTier);
  for (int i = 0; i < 16; ++i) {
    own_table.two_tier_table[i] = 1.0f + 0.0371f * static_cast<float>(i);
  }
  schemes.push_back(own_table);
  // A sub-table count no named format uses.
  Scheme one_table = MustScheme("FP8_CB_K32", ScaleCoding::kNone);
  one_table.n_sub = 1;
  one_table.k = 12;
  ASSERT_TRUE(ValidateScheme(one_table).ok());
  schemes.push_back(one_table);
  const float row_scales[] = {1.0f, 0.0173f, 3.0e38f, -2.5e-3f,
                              std::numeric_limits<float>::quiet_NaN()};
  for (const Scheme& scheme : schemes) {
    Codebooks books;
    for (int sub = 0; sub < scheme.n_sub; ++sub) {
      books.tables[sub].resize(static_cast<size_t>(SubTableRows(scheme, sub)) *
                               static_cast<size_t>(SubTableColumns(scheme)));
      for (float& value : books.tables[sub]) {
        value = Bf16ToFloat(FloatToBf16(normal(rng) * 4.0f));
      }
    }
    ASSERT_TRUE(ValidateCodebooks(scheme, books).ok());
    std::vector<uint8_t> block(static_cast<size_t>(TypeSize(scheme)));
    for (int trial = 0; trial < 8; ++trial) {
      for (uint8_t& byte : block) byte = static_cast<uint8_t>(rng());
      for (const float row_scale : row_scales) {
        float expected[kSuperblock];
        float simd[kSuperblock];
        DecodeSuperblock(scheme, books, block.data(), row_scale, expected);
        DecodeSuperblockSimd(scheme, books, block.data(), row_scale, simd);
        for (int i = 0; i < kSuperblock; ++i) {
          if (!std::isnan(expected[i])) {
            ASSERT_EQ(Bf16ToFloat(FloatToBf16(expected[i])), expected[i])
                << "not a bf16 value: k " << scheme.k << " value " << i;
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(simd[i]),
                    std::bit_cast<uint32_t>(expected[i]))
              << SimdTargetName() << " k " << scheme.k << " n_sub "
              << scheme.n_sub << " row scale " << row_scale << " value " << i;
        }
      }
    }
  }
}

MNEME_INSTANTIATE_HWY_TARGETS(GridbookSimdTest);

}  // namespace
}  // namespace mneme::formats::gridbook
