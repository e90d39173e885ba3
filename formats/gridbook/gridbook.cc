#include "formats/gridbook/gridbook.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"

namespace mneme::formats::gridbook {
namespace {

// Scale-plane bytes of the fp4 codings.
constexpr int kE4m3PlaneBytes = 16;
constexpr int kTwoTierPlaneBytes = 9;

}  // namespace

void DecodeGroupScales(const Scheme& scheme, const uint8_t* block,
                       float* scales) {
  const uint8_t* plane = block + kCodewordsPerSuperblock * scheme.k / 8;
  if (scheme.scale_coding == ScaleCoding::kE4m3) {
    for (int g = 0; g < kSuperblock / kGroupSize; ++g) {
      scales[g] = E4m3ToFloat(plane[g]);
    }
    return;
  }
  const int exponent = static_cast<int>(plane[0]) - scheme.super_bias;
  // T * 2^e: with 2^e a normal fp32 value the product rounds the exact value
  // once, as ldexp does (and is much cheaper); other exponents take ldexp.
  const bool normal_power = exponent >= -126 && exponent <= 127;
  const float power =
      normal_power
          ? std::bit_cast<float>(static_cast<uint32_t>(exponent + 127) << 23)
          : 0.0f;
  for (int g = 0; g < kSuperblock / kGroupSize; ++g) {
    const int index = (plane[1 + g / 2] >> (4 * (g % 2))) & 0xF;
    scales[g] = normal_power
                    ? scheme.two_tier_table[index] * power
                    : std::ldexp(scheme.two_tier_table[index], exponent);
  }
}

std::array<float, 16> DefaultTwoTierTable() {
  std::array<float, 16> table{};
  for (int i = 0; i < 8; ++i) {
    table[i] = 1.0f + 0.125f * static_cast<float>(i);
    table[8 + i] = 2.0f + 0.25f * static_cast<float>(i);
  }
  return table;
}

absl::StatusOr<Scheme> SchemeForFormat(absl::string_view format,
                                       ScaleCoding scale_coding) {
  Scheme scheme;
  absl::string_view digits;
  if (absl::StartsWith(format, "NVFP4_CB_K")) {
    scheme.grid = Grid::kFp4;
    scheme.mode = Mode::kProduct;
    scheme.n_sub = 2;
    digits = format.substr(10);
  } else if (absl::StartsWith(format, "NVFP4_CB_S")) {
    scheme.grid = Grid::kFp4;
    scheme.mode = Mode::kSigned;
    scheme.n_sub = 1;
    digits = format.substr(10);
  } else if (absl::StartsWith(format, "FP8_CB_K")) {
    scheme.grid = Grid::kFp8;
    scheme.mode = Mode::kProduct;
    scheme.n_sub = 4;
    digits = format.substr(8);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown GridBook format \"", format,
                     "\" (NVFP4_CB_K<k>, NVFP4_CB_S<k> or FP8_CB_K<k>)"));
  }
  if (!absl::SimpleAtoi(digits, &scheme.k)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GridBook format \"", format, "\" has no bit count"));
  }
  if (scheme.grid == Grid::kFp4) {
    scheme.scale_coding = scale_coding;
    scheme.two_tier_table = DefaultTwoTierTable();
  } else {
    scheme.scale_coding = ScaleCoding::kNone;
  }
  if (absl::Status status = ValidateScheme(scheme); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GridBook format \"", format, "\": ", status.message()));
  }
  return scheme;
}

absl::Status ValidateScheme(const Scheme& scheme) {
  if (scheme.grid == Grid::kFp8) {
    if (scheme.scale_coding != ScaleCoding::kNone) {
      return absl::InvalidArgumentError(
          "an fp8 scheme has no scale plane (scale_coding must be none)");
    }
  } else if (scheme.scale_coding == ScaleCoding::kNone) {
    return absl::InvalidArgumentError(
        "an fp4 scheme needs e4m3 (v1) or two-tier (v2) scale coding");
  }
  if (scheme.mode == Mode::kSigned) {
    if (scheme.n_sub != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("signed mode has one table, not n_sub ", scheme.n_sub));
    }
    if (scheme.k < 9 || scheme.k > 24) {
      return absl::InvalidArgumentError(absl::StrCat(
          "signed mode k ", scheme.k, " (8 sign bits and 1 to 16 index bits)"));
    }
  } else {
    if (scheme.n_sub != 1 && scheme.n_sub != 2 && scheme.n_sub != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("n_sub ", scheme.n_sub,
                       " (1, 2 or 4 sub-tables dividing the 8-value "
                       "codeword)"));
    }
    // A sub-table of more than 2^16 rows is not a codebook anyone ships;
    // 64 bits is the codeword limit of the decoder.
    if (scheme.k < scheme.n_sub || scheme.k > 48 ||
        (scheme.k + scheme.n_sub - 1) / scheme.n_sub > 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "k ", scheme.k, " with n_sub ", scheme.n_sub,
          " (1 to 16 bits per sub-index, at most 48 bits per codeword)"));
    }
  }
  if (scheme.scale_coding == ScaleCoding::kTwoTier) {
    for (const float value : scheme.two_tier_table) {
      if (!std::isfinite(value) || value < 0.0f) {
        return absl::InvalidArgumentError(
            "the two-tier table holds a negative or non-finite value");
      }
    }
  }
  return absl::OkStatus();
}

int BitWidth(const Scheme& scheme, int sub) {
  if (scheme.mode == Mode::kSigned) return scheme.k - kVectorDim;
  return scheme.k / scheme.n_sub + (sub < scheme.k % scheme.n_sub ? 1 : 0);
}

int64_t SubTableRows(const Scheme& scheme, int sub) {
  return int64_t{1} << BitWidth(scheme, sub);
}

int SubTableColumns(const Scheme& scheme) { return kVectorDim / scheme.n_sub; }

int TypeSize(const Scheme& scheme) {
  const int index_bytes = kCodewordsPerSuperblock * scheme.k / 8;
  switch (scheme.scale_coding) {
    case ScaleCoding::kE4m3:
      return index_bytes + kE4m3PlaneBytes;
    case ScaleCoding::kTwoTier:
      return index_bytes + kTwoTierPlaneBytes;
    case ScaleCoding::kNone:
      break;
  }
  return index_bytes;
}

absl::Status ValidateCodebooks(const Scheme& scheme, const Codebooks& books) {
  for (int sub = 0; sub < kMaxSubTables; ++sub) {
    const int64_t expected =
        sub < scheme.n_sub ? SubTableRows(scheme, sub) * SubTableColumns(scheme)
                           : 0;
    const auto& table = books.tables[sub];
    if (static_cast<int64_t>(table.size()) != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("codebook sub-table ", sub, " has ", table.size(),
                       " values; the scheme needs ", expected));
    }
    for (size_t i = 0; i < table.size(); ++i) {
      if (!std::isfinite(table[i])) {
        return absl::DataLossError(absl::StrCat(
            "codebook sub-table ", sub, " value ", i, " is not finite"));
      }
    }
  }
  return absl::OkStatus();
}

void ExtractCodewords(const uint8_t* block, int k, uint64_t* codewords) {
  // The index bytes copied with 8 bytes of zeros after them, so every
  // codeword is one unaligned 8-byte little-endian read (k + 7 <= 64 bits).
  const int index_bytes = kCodewordsPerSuperblock * k / 8;
  uint8_t padded[kCodewordsPerSuperblock * 48 / 8 + 8] = {};
  std::memcpy(padded, block, static_cast<size_t>(index_bytes));
  const uint64_t mask = (uint64_t{1} << k) - 1;
  for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
    const int first_bit = v * k;
    uint64_t window;
    std::memcpy(&window, padded + first_bit / 8, 8);  // little-endian hosts
    codewords[v] = (window >> (first_bit % 8)) & mask;
  }
}

void DecodeSuperblock(const Scheme& scheme, const Codebooks& books,
                      const uint8_t* block, float row_scale, float* out) {
  uint64_t codewords[kCodewordsPerSuperblock];
  ExtractCodewords(block, scheme.k, codewords);
  float values[kSuperblock];
  if (scheme.mode == Mode::kSigned) {
    const float* table = books.tables[0].data();
    for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
      const uint64_t code = codewords[v];
      const float* magnitudes = table + (code >> kVectorDim) * kVectorDim;
      for (int j = 0; j < kVectorDim; ++j) {
        values[v * kVectorDim + j] =
            ((code >> j) & 1u) != 0 ? -magnitudes[j] : magnitudes[j];
      }
    }
  } else {
    const int columns = SubTableColumns(scheme);
    for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
      uint64_t code = codewords[v];
      for (int sub = 0; sub < scheme.n_sub; ++sub) {
        const int width = BitWidth(scheme, sub);
        const uint64_t index = code & ((uint64_t{1} << width) - 1);
        code >>= width;
        const float* row = books.tables[sub].data() + index * columns;
        for (int j = 0; j < columns; ++j) {
          values[v * kVectorDim + sub * columns + j] = row[j];
        }
      }
    }
  }
  if (scheme.grid == Grid::kFp8) {
    for (int i = 0; i < kSuperblock; ++i) {
      out[i] = Bf16ToFloat(FloatToBf16(values[i] * row_scale));
    }
    return;
  }
  float scales[kSuperblock / kGroupSize];
  DecodeGroupScales(scheme, block, scales);
  // An E2M1 value times an e4m3 group scale, or a scale of the default
  // two-tier table, has at most 6 significant bits, the lowest at 2^-131 or
  // above: exact in fp32 and in bf16 (subnormals included), so the
  // contract's bf16 rounding is the identity there; an artifact's own
  // two-tier table may hold values that are not, and is rounded.
  for (int i = 0; i < kSuperblock; ++i) {
    out[i] = Bf16ToFloat(FloatToBf16(values[i] * scales[i / kGroupSize]));
  }
}

void DecodeRowBf16(const Scheme& scheme, const Codebooks& books,
                   const uint8_t* row, int64_t in_features, float row_scale,
                   uint16_t* out) {
  const int type_size = TypeSize(scheme);
  float values[kSuperblock];
  for (int64_t s = 0; s < in_features / kSuperblock; ++s) {
    DecodeSuperblock(scheme, books, row + s * type_size, row_scale, values);
    for (int i = 0; i < kSuperblock; ++i) {
      out[s * kSuperblock + i] = FloatToBf16(values[i]);
    }
  }
}

void QuantizeActivationsW4A4(const float* x, int64_t count, float global_scale,
                             float* xq, uint8_t* codes, uint8_t* scales) {
  const float inverse = 1.0f / global_scale;
  float xs[kGroupSize];
  for (int64_t g = 0; g < count / kGroupSize; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < kGroupSize; ++i) {
      xs[i] = x[g * kGroupSize + i] * global_scale;
      amax = std::max(amax, std::fabs(xs[i]));
    }
    const uint8_t sf_code = FloatToE4m3(std::min(amax / 6.0f, kE4m3Max));
    const float sf = E4m3ToFloat(sf_code);
    if (scales != nullptr) scales[g] = sf_code;
    for (int i = 0; i < kGroupSize; ++i) {
      uint8_t code;
      if (sf == 0.0f) {
        code = std::signbit(xs[i]) ? 0x8 : 0x0;
      } else {
        code = FloatToE2m1(std::clamp(xs[i] / sf, -6.0f, 6.0f));
      }
      if (codes != nullptr) codes[g * kGroupSize + i] = code;
      xq[g * kGroupSize + i] = (E2m1ToFloat(code) * sf) * inverse;
    }
  }
}

}  // namespace mneme::formats::gridbook
