// GridBook decode against the numpy reference (gridbook_reference.py, written
// from gridbook's SPEC.md and cb_torch_reference.py): every case's decoded
// weight bit for bit as bf16, for the fp4 ladders in both scale codings, the
// signed mode and the fp8 ladder with odd splits.

#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/gridbook_artifact.h"
#include "common/sha256.h"
#include "formats/bf16.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/formats/vector_file.h"

namespace mneme::formats::gridbook {
namespace {

using ::mneme::testing::VectorFile;

bool IsBf16Nan(uint16_t bits) {
  return (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0;
}

TEST(GridbookVectors, EveryCaseDecodesBitExact) {
  auto file = VectorFile::OpenFromEnvironment();
  ASSERT_NE(file, nullptr);
  const auto it = file->metadata().find("cases");
  ASSERT_NE(it, file->metadata().end());
  const auto cases = nlohmann::json::parse(it->second);
  ASSERT_TRUE(cases.is_array());
  ASSERT_GE(cases.size(), 10u);
  for (const auto& entry : cases) {
    const std::string name = entry.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const std::string coding = entry.at("scale_coding").get<std::string>();
    const ScaleCoding scale_coding = coding == "v1"   ? ScaleCoding::kE4m3
                                     : coding == "v2" ? ScaleCoding::kTwoTier
                                                      : ScaleCoding::kNone;
    auto scheme =
        SchemeForFormat(entry.at("format").get<std::string>(), scale_coding);
    ASSERT_TRUE(scheme.ok()) << scheme.status();
    ASSERT_EQ(scheme->k, entry.at("k").get<int>());
    ASSERT_EQ(scheme->n_sub, entry.at("n_sub").get<int>());
    ASSERT_EQ(TypeSize(*scheme), entry.at("type_size").get<int>());
    if (entry.contains("table") && entry.at("table").is_array()) {
      for (int i = 0; i < 16; ++i) {
        scheme->two_tier_table[i] = entry.at("table")[i].get<float>();
      }
    }
    for (int sub = 0; sub < scheme->n_sub; ++sub) {
      ASSERT_EQ(BitWidth(*scheme, sub), entry.at("widths")[sub].get<int>());
    }

    Codebooks books;
    for (int sub = 0; sub < scheme->n_sub; ++sub) {
      const std::string table_name = scheme->mode == Mode::kSigned
                                         ? name + ".table"
                                         : absl::StrCat(name, ".sub", sub);
      for (const uint16_t bits : file->Read<uint16_t>(table_name)) {
        books.tables[sub].push_back(Fp16ToFloat(bits));
      }
    }
    ASSERT_TRUE(ValidateCodebooks(*scheme, books).ok());

    const int64_t rows = entry.at("rows").get<int64_t>();
    const int64_t in = entry.at("in").get<int64_t>();
    const auto qweight = file->Read<uint8_t>(name + ".qweight");
    ASSERT_EQ(static_cast<int64_t>(qweight.size()),
              rows * (in / kSuperblock) * TypeSize(*scheme));
    std::vector<float> row_scales(rows, 1.0f);
    if (scheme->grid == Grid::kFp8) {
      row_scales = file->Read<float>(name + ".weight_scale");
      ASSERT_EQ(static_cast<int64_t>(row_scales.size()), rows);
    }
    const auto expected = file->Read<uint16_t>(name + ".weight");
    ASSERT_EQ(static_cast<int64_t>(expected.size()), rows * in);
    std::vector<uint16_t> row(in);
    int mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row_bytes =
          qweight.data() + r * (in / kSuperblock) * TypeSize(*scheme);
      DecodeRowBf16(*scheme, books, row_bytes, in, row_scales[r], row.data());
      // The SIMD decoder gives the same bits (as fp32 holding bf16 values).
      float simd[kSuperblock];
      for (int64_t s = 0; s < in / kSuperblock; ++s) {
        DecodeSuperblockSimd(*scheme, books, row_bytes + s * TypeSize(*scheme),
                             row_scales[r], simd);
        for (int i = 0; i < kSuperblock; ++i) {
          const uint16_t bits = FloatToBf16(simd[i]);
          if (IsBf16Nan(bits) && IsBf16Nan(row[s * kSuperblock + i])) continue;
          if ((bits != row[s * kSuperblock + i] ||
               Bf16ToFloat(bits) != simd[i]) &&
              ++mismatches <= 5) {
            ADD_FAILURE() << "SIMD (" << SimdTargetName() << ") row " << r
                          << " weight " << s * kSuperblock + i;
          }
        }
      }
      for (int64_t i = 0; i < in; ++i) {
        // A scale past the fp32 range times a zero value is NaN on both
        // sides; its sign bit is the CPU's choice (loaders refuse such
        // scales).
        if (IsBf16Nan(row[i]) && IsBf16Nan(expected[r * in + i])) continue;
        if (row[i] != expected[r * in + i] && ++mismatches <= 5) {
          ADD_FAILURE() << "row " << r << " weight " << i << ": 0x" << std::hex
                        << row[i] << " vs 0x" << expected[r * in + i];
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// The static NVFP4 activation contract: codes, group scales and the
// dequantized activations, bit for bit (ties, zero groups, clamps).
TEST(GridbookVectors, ActivationContractIsBitExact) {
  auto file = VectorFile::OpenFromEnvironment();
  ASSERT_NE(file, nullptr);
  const auto x = file->Read<float>("act.x");
  const auto g = file->Read<float>("act.G");
  const auto codes = file->Read<uint8_t>("act.codes");
  const auto scales = file->Read<uint8_t>("act.sf");
  const auto xq = file->Read<float>("act.xq");
  ASSERT_EQ(g.size(), 1u);
  ASSERT_EQ(codes.size(), x.size());
  ASSERT_EQ(scales.size(), x.size() / kGroupSize);
  std::vector<float> out(x.size());
  std::vector<uint8_t> out_codes(x.size());
  std::vector<uint8_t> out_scales(x.size() / kGroupSize);
  QuantizeActivationsW4A4(x.data(), static_cast<int64_t>(x.size()), g[0],
                          out.data(), out_codes.data(), out_scales.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(out_codes[i], codes[i]) << "value " << i << " = " << x[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(xq[i]))
        << "value " << i << ": " << out[i] << " vs " << xq[i];
  }
  EXPECT_EQ(out_scales, scales);
}

// The codebook digest (SHA-256 of a table's fp16 bytes) and the W4A4
// contract's target_values_sha256, as the reference computes them.
TEST(GridbookVectors, DigestsMatchTheReference) {
  auto file = VectorFile::OpenFromEnvironment();
  ASSERT_NE(file, nullptr);
  const auto& meta = file->metadata();
  ASSERT_TRUE(meta.contains("digest.sub0"));
  EXPECT_EQ(Sha256Hex(file->Read<uint8_t>("digest.sub0")),
            meta.at("digest.sub0"));
  ASSERT_TRUE(meta.contains("digest.target_values.input"));
  const auto input =
      nlohmann::json::parse(meta.at("digest.target_values.input"));
  std::vector<std::pair<std::string, float>> targets;
  for (const auto& [name, value] : input.at("scales").items()) {
    targets.emplace_back(name, value.get<float>());
  }
  EXPECT_EQ(checkpoint::GridbookContractDigest(
                input.at("policy").get<std::string>(), targets),
            meta.at("digest.target_values"));
}

}  // namespace
}  // namespace mneme::formats::gridbook
