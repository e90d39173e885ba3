// EXL3 decode properties that hold without the reference: the codebooks'
// published scale, the tile permutation, the bitstream's state recurrence,
// the Hadamard transform and the kernel route equal to the dense weight.

#include "formats/exl3/exl3.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "formats/fp16.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/hwy_targets.h"

namespace mneme::formats::exl3 {
namespace {

double TableRms(Codebook codebook) {
  const auto& table = CodebookTable(codebook);
  double sum = 0.0;
  for (const float value : table) sum += static_cast<double>(value) * value;
  return std::sqrt(sum / static_cast<double>(table.size()));
}

TEST(Exl3Codebook, RmsMatchesTheQuantizersScale) {
  // exllamav3 quantize.py hard-codes codebook_scale = 1.24371088 for 3INST.
  EXPECT_NEAR(TableRms(Codebook::k3Inst), 1.24371088, 1e-6);
  EXPECT_NEAR(TableRms(Codebook::kMcg), 1.2441, 1e-3);
  EXPECT_NEAR(TableRms(Codebook::kMul1), 1.0003, 1e-3);
}

TEST(Exl3Codebook, McgHalvesStayInTheirRange) {
  for (const Codebook codebook : {Codebook::k3Inst, Codebook::kMcg}) {
    for (uint32_t state = 0; state < 65536; ++state) {
      const float value = CodebookTable(codebook)[state];
      ASSERT_TRUE(std::isfinite(value));
      ASSERT_LT(std::fabs(value), 4.0f);
    }
  }
}

TEST(Exl3Codebook, SelectionFollowsTheTensorsPresent) {
  EXPECT_EQ(SelectCodebook(true, true), Codebook::kMcg);
  EXPECT_EQ(SelectCodebook(true, false), Codebook::kMcg);
  EXPECT_EQ(SelectCodebook(false, true), Codebook::kMul1);
  EXPECT_EQ(SelectCodebook(false, false), Codebook::k3Inst);
}

TEST(Exl3Tile, PermutationIsABijection) {
  const auto& perm = TilePermutation();
  std::set<int> seen(perm.begin(), perm.end());
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(*seen.rbegin(), 255);
  // Thread 0's first fragment: rows 0, 1, 8, 9 of column 0, then column 8.
  EXPECT_EQ(perm[0], 0);
  EXPECT_EQ(perm[1], 16);
  EXPECT_EQ(perm[2], 128);
  EXPECT_EQ(perm[3], 144);
  EXPECT_EQ(perm[4], 8);
}

// s_j = ((s_{j-1} << K) | symbol_j) & 0xFFFF, tail-biting: each state's low
// K bits are the next symbol of the stream, and state j - 1 shifted by K
// agrees with state j on the bits they share.
TEST(Exl3Tile, StatesFollowTheShiftRecurrence) {
  std::mt19937 rng(7);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<uint16_t> words(size_t{16} * bits);
    for (auto& word : words) word = static_cast<uint16_t>(rng());
    uint16_t states[kTileValues];
    DecodeTileStates(words.data(), bits, states);
    const uint32_t mask = 0xFFFFu & ~((1u << bits) - 1u);
    for (int j = 0; j < kTileValues; ++j) {
      const uint16_t previous = states[(j + kTileValues - 1) % kTileValues];
      ASSERT_EQ((static_cast<uint32_t>(previous) << bits) & mask,
                states[j] & mask)
          << "bits " << bits << " position " << j;
    }
  }
}

// A tile whose stream is written MSB-first as 16-bit words, each little-endian
// uint32 pair swapped (exllamav3's packer), reads back its symbols.
TEST(Exl3Tile, PackedSymbolsReadBack) {
  std::mt19937 rng(11);
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<int> symbols(kTileValues);
    for (auto& symbol : symbols) {
      symbol = static_cast<int>(rng() % (1u << bits));
    }
    std::vector<int> stream;
    for (const int symbol : symbols) {
      for (int b = bits - 1; b >= 0; --b) stream.push_back((symbol >> b) & 1);
    }
    std::vector<uint16_t> words(size_t{16} * bits, 0);
    for (size_t i = 0; i < stream.size(); ++i) {
      const size_t word = i / 16;
      // Stream word 2i is stored at p[2i + 1] and 2i + 1 at p[2i].
      words[word ^ 1] |= static_cast<uint16_t>(stream[i] << (15 - i % 16));
    }
    uint16_t states[kTileValues];
    DecodeTileStates(words.data(), bits, states);
    for (int j = 0; j < kTileValues; ++j) {
      ASSERT_EQ(states[j] & ((1 << bits) - 1), symbols[j])
          << "bits " << bits << " position " << j;
    }
  }
}

TEST(Exl3Hadamard, IsOrthonormalAndSymmetric) {
  // Column j of H is H applied to e_j; H[i][j] = (-1)^popcount(i & j).
  for (int j = 0; j < kHadamardSize; j += 17) {
    std::vector<float> column(kHadamardSize, 0.0f);
    column[j] = 1.0f;
    Hadamard128(column.data());
    for (int i = 0; i < kHadamardSize; ++i) {
      const float expected =
          (__builtin_popcount(i & j) % 2 == 0 ? 1.0f : -1.0f) /
          std::sqrt(128.0f);
      ASSERT_NEAR(column[i], expected, 1e-7);
    }
    Hadamard128(column.data());
    for (int i = 0; i < kHadamardSize; ++i) {
      ASSERT_NEAR(column[i], i == j ? 1.0f : 0.0f, 1e-6);
    }
  }
}

TEST(Exl3Weight, ValidationNamesTheProblem) {
  std::vector<uint16_t> data(size_t{128} * 128, 0);
  Exl3Weight weight{.in_features = 128,
                    .out_features = 128,
                    .bits = 4,
                    .codebook = Codebook::kMcg,
                    .trellis = data.data(),
                    .suh = data.data(),
                    .svh = data.data()};
  EXPECT_TRUE(ValidateExl3Weight(weight).ok());
  weight.bits = 9;
  EXPECT_EQ(ValidateExl3Weight(weight).code(),
            absl::StatusCode::kInvalidArgument);
  weight.bits = 4;
  weight.out_features = 96;
  EXPECT_EQ(ValidateExl3Weight(weight).code(),
            absl::StatusCode::kInvalidArgument);
  weight.out_features = 128;
  weight.svh = nullptr;
  EXPECT_EQ(ValidateExl3Weight(weight).code(),
            absl::StatusCode::kInvalidArgument);
}

// exllamav3's kernel route: y = had(had(x * suh) What) * svh; the dense
// weight from DequantizeOutputRows must give the same product, also for a
// slice of the output rows (a tensor-parallel shard).
TEST(Exl3Weight, DenseWeightMatchesTheKernelRoute) {
  constexpr int64_t k = 256;
  constexpr int64_t n = 384;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
  for (int bits : {2, 5}) {
    std::vector<uint16_t> trellis(TrellisBytes(k, n, bits) / 2);
    for (auto& word : trellis) word = static_cast<uint16_t>(rng());
    std::vector<uint16_t> suh(k);
    std::vector<uint16_t> svh(n);
    for (auto& s : suh) {
      s = FloatToFp16((rng() % 2 ? -0.01f : 0.01f) * uniform(rng));
    }
    for (auto& s : svh) {
      s = FloatToFp16((rng() % 2 ? -0.01f : 0.01f) * uniform(rng));
    }
    const Exl3Weight weight{.in_features = k,
                            .out_features = n,
                            .bits = bits,
                            .codebook = Codebook::kMul1,
                            .trellis = trellis.data(),
                            .suh = suh.data(),
                            .svh = svh.data()};
    std::vector<float> x(k);
    for (auto& v : x) v = uniform(rng) - 1.25f;
    // Kernel route.
    std::vector<float> xh(k);
    for (int64_t i = 0; i < k; ++i) xh[i] = x[i] * Fp16ToFloat(suh[i]);
    for (int64_t b = 0; b < k; b += kHadamardSize) Hadamard128(&xh[b]);
    std::vector<float> what(k * n);
    DecodeTrellis(weight, what.data());
    std::vector<float> y(n, 0.0f);
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < n; ++j) y[j] += xh[i] * what[i * n + j];
    }
    for (int64_t b = 0; b < n; b += kHadamardSize) Hadamard128(&y[b]);
    for (int64_t j = 0; j < n; ++j) y[j] *= Fp16ToFloat(svh[j]);
    // Dense route, rows [128, 384) of W^T.
    std::vector<float> dense((n - 128) * k);
    DequantizeOutputRows(weight, 128, n, dense.data());
    for (int64_t j = 128; j < n; ++j) {
      double sum = 0.0;
      for (int64_t i = 0; i < k; ++i) sum += x[i] * dense[(j - 128) * k + i];
      ASSERT_NEAR(sum, y[j], 1e-5 + 1e-4 * std::fabs(y[j]))
          << "bits " << bits << " output " << j;
    }
  }
}

// The SIMD stream decoder equals the scalar reference bit for bit on every
// Highway target this binary carries that the CPU supports (each forced in
// turn), for every K and codebook, on random tiles and on the all-zero and
// all-one streams (states 0 and 0xFFFF).
class Exl3SimdTest : public ::mneme::testing::HwyTargetTest {};

// Every state of every codebook: the computed values are the table's.
TEST_P(Exl3SimdTest, CodebookValuesMatchTheTableForEveryState) {
  std::vector<uint16_t> states(65536 + 5);
  for (size_t i = 0; i < states.size(); ++i) {
    states[i] = static_cast<uint16_t>(i);
  }
  for (const Codebook codebook :
       {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
    const auto& table = CodebookTable(codebook);
    std::vector<float> values(states.size());
    CodebookValuesSimd(codebook, states.data(),
                       static_cast<int64_t>(states.size()), values.data());
    for (size_t i = 0; i < states.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(values[i]),
                std::bit_cast<uint32_t>(table[states[i]]))
          << SimdTargetName() << " " << CodebookName(codebook) << " state "
          << states[i];
    }
  }
}

TEST_P(Exl3SimdTest, StreamDecodeMatchesTheScalarReference) {
  std::mt19937 rng(7);
  for (const Codebook codebook :
       {Codebook::k3Inst, Codebook::kMcg, Codebook::kMul1}) {
    for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
      std::vector<uint16_t> words(16 * static_cast<size_t>(bits));
      for (int trial = 0; trial < 20; ++trial) {
        for (uint16_t& word : words) {
          word = trial == 0   ? 0
                 : trial == 1 ? 0xFFFF
                              : static_cast<uint16_t>(rng());
        }
        float expected[kTileValues];
        float simd[kTileValues];
        DecodeTileStream(words.data(), bits, codebook, expected);
        DecodeTileStreamSimd(words.data(), bits, codebook, simd);
        for (int j = 0; j < kTileValues; ++j) {
          ASSERT_EQ(std::bit_cast<uint32_t>(simd[j]),
                    std::bit_cast<uint32_t>(expected[j]))
              << SimdTargetName() << " " << CodebookName(codebook) << " K "
              << bits << " trial " << trial << " position " << j;
        }
      }
    }
  }
}

TEST_P(Exl3SimdTest, StreamDecodeIsTheTileThroughThePermutation) {
  std::mt19937 rng(11);
  const auto& table = CodebookTable(Codebook::kMul1);
  const auto& perm = TilePermutation();
  for (int bits = kMinBits; bits <= kMaxBits; ++bits) {
    std::vector<uint16_t> words(16 * static_cast<size_t>(bits));
    for (uint16_t& word : words) word = static_cast<uint16_t>(rng());
    float tile[kTileValues];
    float stream[kTileValues];
    DecodeTile(words.data(), bits, table, tile);
    DecodeTileStreamSimd(words.data(), bits, Codebook::kMul1, stream);
    for (int j = 0; j < kTileValues; ++j) {
      ASSERT_EQ(stream[j], tile[perm[j]]) << "K " << bits << " position " << j;
    }
  }
}

MNEME_INSTANTIATE_HWY_TARGETS(Exl3SimdTest);

}  // namespace
}  // namespace mneme::formats::exl3
