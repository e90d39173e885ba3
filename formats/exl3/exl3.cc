#include "formats/exl3/exl3.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "formats/fp16.h"

namespace mneme::formats::exl3 {
namespace {

// The MCG tail shared by 3INST and MCG (codebook.cuh): keep the sign and
// four low exponent bits of each half, set the high exponent bits so each
// half lies in +-[0.125, 2), then add the halves in fp16.
uint16_t McgTail(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  const float low = Fp16ToFloat(static_cast<uint16_t>(x & 0xFFFFu));
  const float high = Fp16ToFloat(static_cast<uint16_t>(x >> 16));
  // Exact in fp32 (11-bit significands whose exponents differ by at most 3),
  // so this rounds once, as __hadd does.
  return FloatToFp16(low + high);
}

uint16_t Mul1Value(uint32_t x) {
  x *= 0x83DCD12Du;
  const uint32_t byte_sum =
      (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
  // fp16 0x6400 + s is 1024 + s (the spacing there is 1; s <= 1020).
  const float h = 1024.0f + static_cast<float>(byte_sum);
  const float k_inv = Fp16ToFloat(0x1EEEu);
  const float k_bias = Fp16ToFloat(0xC931u);
  // h * k_inv has at most 22 significant bits and the sum stays below 4
  // with k_bias a multiple of 2^-7, so fp32 holds h * k_inv + k_bias exactly
  // and the conversion is the fused multiply-add's single rounding.
  return FloatToFp16(h * k_inv + k_bias);
}

std::array<uint16_t, kTileValues> MakeTilePermutation() {
  std::array<uint16_t, kTileValues> perm{};
  for (int t = 0; t < 32; ++t) {
    const int r0 = (t % 4) * 2;
    const int rows[4] = {r0, r0 + 1, r0 + 8, r0 + 9};
    const int columns[2] = {t / 4, t / 4 + 8};
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < 4; ++i) {
        perm[8 * t + 4 * half + i] =
            static_cast<uint16_t>(kTileSide * rows[i] + columns[half]);
      }
    }
  }
  return perm;
}

std::array<float, 65536> MakeTable(Codebook codebook) {
  std::array<float, 65536> table{};
  for (uint32_t state = 0; state < 65536; ++state) {
    table[state] =
        Fp16ToFloat(CodebookValue(codebook, static_cast<uint16_t>(state)));
  }
  return table;
}

// The butterflies of the natural-order Walsh-Hadamard transform over 128
// rows of `width` contiguous values each (rows `stride` floats apart), then
// the 1 / sqrt(128) normalization.
void HadamardAcrossRows(float* rows, int64_t stride, int64_t width) {
  for (int64_t h = 1; h < kHadamardSize; h *= 2) {
    for (int64_t i = 0; i < kHadamardSize; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        float* a = rows + j * stride;
        float* b = rows + (j + h) * stride;
        for (int64_t c = 0; c < width; ++c) {
          const float x = a[c];
          const float y = b[c];
          a[c] = x + y;
          b[c] = x - y;
        }
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(kHadamardSize));
  for (int64_t j = 0; j < kHadamardSize; ++j) {
    float* row = rows + j * stride;
    for (int64_t c = 0; c < width; ++c) row[c] *= norm;
  }
}

}  // namespace

const char* CodebookName(Codebook codebook) {
  switch (codebook) {
    case Codebook::k3Inst:
      return "3inst";
    case Codebook::kMcg:
      return "mcg";
    case Codebook::kMul1:
      return "mul1";
  }
  return "unknown";
}

Codebook SelectCodebook(bool has_mcg, bool has_mul1) {
  if (has_mcg) return Codebook::kMcg;
  if (has_mul1) return Codebook::kMul1;
  return Codebook::k3Inst;
}

uint16_t CodebookValue(Codebook codebook, uint16_t state) {
  const uint32_t x = state;
  switch (codebook) {
    case Codebook::k3Inst:
      return McgTail(x * 89226354u + 64248484u);
    case Codebook::kMcg:
      return McgTail(x * 0xCBAC1FEDu);
    case Codebook::kMul1:
      return Mul1Value(x);
  }
  return 0;
}

const std::array<float, 65536>& CodebookTable(Codebook codebook) {
  static const auto* const kTables =
      new std::array<std::array<float, 65536>, 3>{MakeTable(Codebook::k3Inst),
                                                  MakeTable(Codebook::kMcg),
                                                  MakeTable(Codebook::kMul1)};
  return (*kTables)[static_cast<int>(codebook)];
}

const std::array<uint16_t, kTileValues>& TilePermutation() {
  static const std::array<uint16_t, kTileValues> kPermutation =
      MakeTilePermutation();
  return kPermutation;
}

void DecodeTileStates(const uint16_t* words, int bits, uint16_t* states) {
  // The stream's 32-bit words, MSB-first: the little-endian reads of the
  // stored int16 pairs.
  const int num_words = 8 * bits;
  uint32_t stream[8 * kMaxBits + 1];
  for (int i = 0; i < num_words; ++i) {
    stream[i] = static_cast<uint32_t>(words[2 * ptrdiff_t{i}]) |
                (static_cast<uint32_t>(words[2 * ptrdiff_t{i} + 1]) << 16);
  }
  // The word after the last is the first (the stream is circular).
  stream[num_words] = stream[0];
  const int total_bits = kTileValues * bits;
  for (int j = 0; j < kTileValues; ++j) {
    int start = (j + 1) * bits - 16;
    if (start < 0) start += total_bits;  // only the first states wrap
    const unsigned word = static_cast<unsigned>(start) >> 5;
    const uint64_t window =
        (static_cast<uint64_t>(stream[word]) << 32) | stream[word + 1];
    states[j] = static_cast<uint16_t>(
        (window >> (48 - (static_cast<unsigned>(start) & 31u))) & 0xFFFFu);
  }
}

void DecodeTile(const uint16_t* words, int bits,
                const std::array<float, 65536>& table, float* tile) {
  uint16_t states[kTileValues];
  DecodeTileStates(words, bits, states);
  const auto& perm = TilePermutation();
  for (int j = 0; j < kTileValues; ++j) tile[perm[j]] = table[states[j]];
}

void DecodeTileStream(const uint16_t* words, int bits, Codebook codebook,
                      float* values) {
  const auto& table = CodebookTable(codebook);
  uint16_t states[kTileValues];
  DecodeTileStates(words, bits, states);
  for (int j = 0; j < kTileValues; ++j) values[j] = table[states[j]];
}

void Hadamard128(float* values) {
  // HadamardAcrossRows of width 1, its butterflies written over contiguous
  // values so they vectorize (the same operations in the same order).
  for (int h = 1; h < kHadamardSize; h *= 2) {
    for (int i = 0; i < kHadamardSize; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float x = values[j];
        const float y = values[j + h];
        values[j] = x + y;
        values[j + h] = x - y;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(kHadamardSize));
  for (int j = 0; j < kHadamardSize; ++j) values[j] *= norm;
}

void UnpackSigns(const uint16_t* packed, int64_t count, float* signs) {
  for (int64_t i = 0; i < count; ++i) {
    signs[i] = ((packed[i / 16] >> (i % 16)) & 1u) != 0 ? -1.0f : 1.0f;
  }
}

absl::Status ValidateExl3Shape(int64_t in_features, int64_t out_features,
                               int bits) {
  if (in_features <= 0 || out_features <= 0 ||
      in_features % kHadamardSize != 0 || out_features % kHadamardSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EXL3 weight of ", in_features, " x ", out_features,
        ": input and output features must be positive multiples of ",
        kHadamardSize));
  }
  if (bits < kMinBits || bits > kMaxBits) {
    return absl::InvalidArgumentError(
        absl::StrCat("EXL3 weight with ", bits,
                     " bits per weight (the trellis holds 1 to 8)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateExl3Weight(const Exl3Weight& weight) {
  if (absl::Status status = ValidateExl3Shape(weight.in_features,
                                              weight.out_features, weight.bits);
      !status.ok()) {
    return status;
  }
  if (weight.trellis == nullptr || weight.suh == nullptr ||
      weight.svh == nullptr) {
    return absl::InvalidArgumentError(
        "EXL3 weight without its trellis or scales");
  }
  return absl::OkStatus();
}

void DecodeTrellis(const Exl3Weight& weight, float* what) {
  const auto& table = CodebookTable(weight.codebook);
  const int64_t tiles_in = weight.in_features / kTileSide;
  const int64_t tiles_out = weight.out_features / kTileSide;
  const int64_t tile_words = int64_t{kTileSide} * weight.bits;
  float tile[kTileValues];
  for (int64_t tk = 0; tk < tiles_in; ++tk) {
    for (int64_t tn = 0; tn < tiles_out; ++tn) {
      DecodeTile(weight.trellis + (tk * tiles_out + tn) * tile_words,
                 weight.bits, table, tile);
      for (int r = 0; r < kTileSide; ++r) {
        std::copy_n(
            tile + ptrdiff_t{r} * kTileSide, kTileSide,
            what + (tk * kTileSide + r) * weight.out_features + tn * kTileSide);
      }
    }
  }
}

void DequantizeOutputRows(const Exl3Weight& weight, int64_t row_begin,
                          int64_t row_end, float* out) {
  const auto& perm = TilePermutation();
  const int64_t k = weight.in_features;
  const int64_t tiles_out = weight.out_features / kTileSide;
  const int64_t tile_words = int64_t{kTileSide} * weight.bits;
  float values[kTileValues];
  // out[c][r] = What[r][row_begin + c], tile by tile.
  for (int64_t tn = row_begin / kTileSide; tn < row_end / kTileSide; ++tn) {
    float* const tile_out = out + (tn * kTileSide - row_begin) * k;
    for (int64_t tk = 0; tk < k / kTileSide; ++tk) {
      DecodeTileStreamSimd(weight.trellis + (tk * tiles_out + tn) * tile_words,
                           weight.bits, weight.codebook, values);
      for (int j = 0; j < kTileValues; ++j) {
        const int r = perm[j] / kTileSide;
        const int c = perm[j] % kTileSide;
        tile_out[c * k + tk * kTileSide + r] = values[j];
      }
    }
  }
  const int64_t rows = row_end - row_begin;
  // H_k on the left of What: each output row's 128-value input blocks.
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t block = 0; block < k; block += kHadamardSize) {
      Hadamard128(out + row * k + block);
    }
  }
  // H_n on the right: across each block of 128 output rows.
  for (int64_t block = 0; block < rows; block += kHadamardSize) {
    HadamardAcrossRows(out + block * k, k, k);
  }
  std::vector<float> su(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) su[i] = Fp16ToFloat(weight.suh[i]);
  for (int64_t row = 0; row < rows; ++row) {
    const float sv = Fp16ToFloat(weight.svh[row_begin + row]);
    float* values = out + row * k;
    for (int64_t i = 0; i < k; ++i) values[i] *= su[i] * sv;
  }
}

}  // namespace mneme::formats::exl3
