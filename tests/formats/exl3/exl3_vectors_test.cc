// EXL3 decode against the numpy reference of exllamav3's kernels
// (exl3_reference.py, written from the exllamav3 source): every codebook
// value of every state bit for bit, the states and What bit for bit for
// every K (1..8) and codebook, the dense weight and a product within fp32
// rounding, and the legacy packed signs.

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "gtest/gtest.h"
#include "tests/formats/vector_file.h"

namespace mneme::formats::exl3 {
namespace {

using ::mneme::testing::VectorFile;

class Exl3Vectors : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = VectorFile::OpenFromEnvironment();
    ASSERT_NE(file_, nullptr);
  }
  std::unique_ptr<VectorFile> file_;
};

constexpr Codebook kCodebooks[] = {Codebook::k3Inst, Codebook::kMcg,
                                   Codebook::kMul1};

TEST_F(Exl3Vectors, CodebookValuesAreBitExact) {
  for (const Codebook codebook : kCodebooks) {
    const auto expected =
        file_->Read<uint16_t>(absl::StrCat("lut.", CodebookName(codebook)));
    ASSERT_EQ(expected.size(), 65536u);
    int mismatches = 0;
    for (uint32_t state = 0; state < 65536; ++state) {
      const uint16_t value =
          CodebookValue(codebook, static_cast<uint16_t>(state));
      if (value != expected[state] && ++mismatches <= 5) {
        ADD_FAILURE() << CodebookName(codebook) << " state " << state << ": 0x"
                      << std::hex << value << " vs 0x" << expected[state];
      }
    }
    EXPECT_EQ(mismatches, 0) << CodebookName(codebook);
  }
}

TEST_F(Exl3Vectors, StatesAreBitExact) {
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    const std::string name = absl::StrCat("exl3.mcg.K", bits);
    const auto trellis = file_->Read<uint16_t>(name + ".trellis");
    const auto expected = file_->Read<uint16_t>(absl::StrCat("states.K", bits));
    ASSERT_EQ(expected.size(), 4u * kTileValues);
    for (int tile = 0; tile < 4; ++tile) {
      uint16_t states[kTileValues];
      DecodeTileStates(trellis.data() + ptrdiff_t{tile} * 16 * bits, bits,
                       states);
      for (int j = 0; j < kTileValues; ++j) {
        ASSERT_EQ(states[j], expected[tile * kTileValues + j])
            << "K " << bits << " tile " << tile << " position " << j;
      }
    }
  }
}

TEST_F(Exl3Vectors, WeightsMatchEveryBitWidthAndCodebook) {
  for (const Codebook codebook : kCodebooks) {
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      const std::string name =
          absl::StrCat("exl3.", CodebookName(codebook), ".K", bits);
      SCOPED_TRACE(name);
      const auto shape = file_->Shape(name + ".trellis");
      ASSERT_EQ(shape.size(), 3u);
      ASSERT_EQ(shape[2], 16 * bits);
      const int64_t k = shape[0] * 16;
      const int64_t n = shape[1] * 16;
      const auto trellis = file_->Read<uint16_t>(name + ".trellis");
      const auto suh = file_->Read<uint16_t>(name + ".suh");
      const auto svh = file_->Read<uint16_t>(name + ".svh");
      const Exl3Weight weight{.in_features = k,
                              .out_features = n,
                              .bits = bits,
                              .codebook = codebook,
                              .trellis = trellis.data(),
                              .suh = suh.data(),
                              .svh = svh.data()};
      ASSERT_TRUE(ValidateExl3Weight(weight).ok());

      // What, bit for bit (as fp16).
      const auto what_bits = file_->Read<uint16_t>(name + ".what");
      std::vector<float> what(k * n);
      DecodeTrellis(weight, what.data());
      for (int64_t i = 0; i < k * n; ++i) {
        ASSERT_EQ(FloatToFp16(what[i]), what_bits[i])
            << "What[" << i / n << "][" << i % n << "]";
      }

      // What again through the SIMD stream decoder and the tile
      // permutation, bit for bit.
      const auto& perm = TilePermutation();
      for (int64_t tk = 0; tk < k / kTileSide; ++tk) {
        for (int64_t tn = 0; tn < n / kTileSide; ++tn) {
          float values[kTileValues];
          DecodeTileStreamSimd(
              trellis.data() + (tk * (n / kTileSide) + tn) * 16 * bits, bits,
              codebook, values);
          for (int j = 0; j < kTileValues; ++j) {
            const int64_t row = tk * kTileSide + perm[j] / kTileSide;
            const int64_t column = tn * kTileSide + perm[j] % kTileSide;
            ASSERT_EQ(FloatToFp16(values[j]), what_bits[row * n + column])
                << "SIMD (" << SimdTargetName() << ") What[" << row << "]["
                << column << "]";
          }
        }
      }

      // The dense weight (fp64 reference rounded to fp32), transposed.
      const auto expected = file_->Read<float>(name + ".weight");
      std::vector<float> dense(n * k);
      DequantizeOutputRows(weight, 0, n, dense.data());
      double max_error = 0.0;
      double max_value = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          max_error = std::max(max_error,
                               std::fabs(static_cast<double>(dense[j * k + i]) -
                                         expected[i * n + j]));
          max_value = std::max(
              max_value, std::fabs(static_cast<double>(expected[i * n + j])));
        }
      }
      EXPECT_LE(max_error, 1e-5 * max_value) << "max |W| " << max_value;

      // y = x W.
      const auto x = file_->Read<float>(name + ".x");
      const auto y = file_->Read<float>(name + ".y");
      const int64_t m = static_cast<int64_t>(x.size()) / k;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0.0;
          for (int64_t i = 0; i < k; ++i) {
            sum += static_cast<double>(x[r * k + i]) * dense[j * k + i];
          }
          ASSERT_NEAR(sum, y[r * n + j], 1e-5 + 1e-4 * std::fabs(y[r * n + j]))
              << "row " << r << " output " << j;
        }
      }
    }
  }
}

TEST_F(Exl3Vectors, LegacySignsUnpack) {
  for (const char* which : {"su", "sv"}) {
    const auto packed = file_->Read<uint16_t>(absl::StrCat("legacy.", which));
    const auto expected =
        file_->Read<float>(absl::StrCat("legacy.", which, "_values"));
    ASSERT_EQ(expected.size(), packed.size() * 16);
    std::vector<float> signs(expected.size());
    UnpackSigns(packed.data(), static_cast<int64_t>(signs.size()),
                signs.data());
    EXPECT_EQ(signs, expected) << which;
  }
}

}  // namespace
}  // namespace mneme::formats::exl3
