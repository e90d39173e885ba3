// Highway kernels of codebook_kernels.h. This file is compiled once per SIMD
// target by hwy/foreach_target.h (it includes itself), and
// HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time
// (the pattern of quant_kernels.cc). The decoding itself is the formats'
// SIMD decoders (formats/exl3, formats/gridbook), bit-exact to their scalar
// references; these kernels only multiply and sum.
//
// EXL3 tiles are used in the order the stream decodes them, never permuted:
// position j of a tile holds row perm[j] / 16 and column perm[j] % 16
// (TilePermutation), where the row depends only on j % 32 and the column only
// on j / 32 and j % 8 (the tensor-core fragment order). So the input is
// permuted once per product (32 values per tile row: x[tk * 16 + row(m)],
// m = j % 32), each tile position is one multiply-add into 64 partial sums
// (index 8 (j / 32) + j % 8, vectors of at most 8 lanes), and the 64 sums
// are folded into the tile's 16 columns once per 128-output block.

#include "gpu/cpu/codebook_kernels.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "gpu/cpu/codebook_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#ifndef MNEME_GPU_CPU_CODEBOOK_KERNELS_ONCE_
#define MNEME_GPU_CPU_CODEBOOK_KERNELS_ONCE_
namespace mneme::gpu::codebook_kernels::internal {

namespace x3 = formats::exl3;

// Tile positions per row pattern, partial sums per tile.
inline constexpr int kPatternValues = 32;
inline constexpr int kPartialSums = 64;

// The input row (0..15) of tile positions j with j % 32 = m.
inline const std::array<uint8_t, kPatternValues>& Exl3RowPattern() {
  static const std::array<uint8_t, kPatternValues> kPattern = [] {
    std::array<uint8_t, kPatternValues> pattern{};
    const auto& perm = x3::TilePermutation();
    for (int m = 0; m < kPatternValues; ++m) {
      pattern[m] = static_cast<uint8_t>(perm[m] / x3::kTileSide);
    }
    return pattern;
  }();
  return kPattern;
}

// The output column (0..15) of partial sum e = 8 q + l (positions 32 q + l
// + 8 i, i < 4).
inline const std::array<uint8_t, kPartialSums>& Exl3SumColumns() {
  static const std::array<uint8_t, kPartialSums> kColumns = [] {
    std::array<uint8_t, kPartialSums> columns{};
    const auto& perm = x3::TilePermutation();
    for (int e = 0; e < kPartialSums; ++e) {
      columns[e] =
          static_cast<uint8_t>(perm[32 * (e / 8) + e % 8] % x3::kTileSide);
    }
    return columns;
  }();
  return kColumns;
}

}  // namespace mneme::gpu::codebook_kernels::internal
#endif  // MNEME_GPU_CPU_CODEBOOK_KERNELS_ONCE_

HWY_BEFORE_NAMESPACE();
namespace mneme::gpu::codebook_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace gb = formats::gridbook;
namespace x3 = formats::exl3;
using internal::kPartialSums;
using internal::kPatternValues;

int64_t CurrentTarget() { return HWY_TARGET; }

float RowScale(const PackedMatrix& w, int64_t row) {
  if (w.gridbook_scheme.grid != gb::Grid::kFp8) return 1.0f;
  float scale;
  std::memcpy(&scale, w.scale + 4 * row, 4);
  return scale;
}

// sum a[i] b[i], i < 256 (two vector accumulators).
HWY_INLINE float Dot256(const float* HWY_RESTRICT a,
                        const float* HWY_RESTRICT b) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  auto sum0 = hn::Zero(df);
  auto sum1 = hn::Zero(df);
  for (size_t i = 0; i < static_cast<size_t>(gb::kSuperblock); i += 2 * lanes) {
    sum0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), sum0);
    sum1 = hn::MulAdd(hn::LoadU(df, a + i + lanes),
                      hn::LoadU(df, b + i + lanes), sum1);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
}

void GridbookDotRowsKernel(const PackedMatrix& w, const float* HWY_RESTRICT x,
                           int64_t tokens, int64_t row_begin, int64_t row_end,
                           float* HWY_RESTRICT y, int64_t ldy,
                           bool accumulate) {
  const int64_t type_size = gb::TypeSize(w.gridbook_scheme);
  const int64_t blocks = w.cols / gb::kSuperblock;
  HWY_ALIGN float values[gb::kSuperblock];
  float sums[kMaxExl3Tokens];
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float row_scale = RowScale(w, r);
    for (int64_t t0 = 0; t0 < tokens; t0 += kMaxExl3Tokens) {
      const int64_t count = std::min(kMaxExl3Tokens, tokens - t0);
      std::fill(sums, sums + count, 0.0f);
      for (int64_t s = 0; s < blocks; ++s) {
        gb::DecodeSuperblockSimd(w.gridbook_scheme, *w.gridbook_books,
                                 w.data + (r * blocks + s) * type_size,
                                 row_scale, values);
        for (int64_t t = 0; t < count; ++t) {
          sums[t] +=
              Dot256(x + (t0 + t) * w.cols + s * gb::kSuperblock, values);
        }
      }
      for (int64_t t = 0; t < count; ++t) {
        float& out = y[(t0 + t) * ldy + r];
        out = accumulate ? out + sums[t] : sums[t];
      }
    }
  }
}

void GridbookDecodeRowsKernel(const PackedMatrix& w, int64_t begin, int64_t end,
                              float* HWY_RESTRICT out) {
  const int64_t type_size = gb::TypeSize(w.gridbook_scheme);
  const int64_t blocks = w.cols / gb::kSuperblock;
  for (int64_t r = begin; r < end; ++r) {
    const float row_scale = RowScale(w, r);
    for (int64_t s = 0; s < blocks; ++s) {
      gb::DecodeSuperblockSimd(
          w.gridbook_scheme, *w.gridbook_books,
          w.data + (r * blocks + s) * type_size, row_scale,
          out + (r - begin) * w.cols + s * gb::kSuperblock);
    }
  }
}

void Exl3TransformInputKernel(const PackedMatrix& w,
                              const float* HWY_RESTRICT x, int64_t tokens,
                              float* HWY_RESTRICT xp) {
  const auto* suh = reinterpret_cast<const uint16_t*>(w.scale);
  const auto& pattern = internal::Exl3RowPattern();
  float block[x3::kHadamardSize];
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * w.cols;
    float* out = xp + 2 * t * w.cols;
    for (int64_t b = 0; b < w.cols; b += x3::kHadamardSize) {
      for (int c = 0; c < x3::kHadamardSize; ++c) {
        block[c] = xt[b + c] * formats::Fp16ToFloat(suh[b + c]);
      }
      x3::Hadamard128(block);
      for (int tile = 0; tile < x3::kHadamardSize / x3::kTileSide; ++tile) {
        float* dst = out + 2 * b + ptrdiff_t{tile} * kPatternValues;
        for (int m = 0; m < kPatternValues; ++m) {
          dst[m] = block[tile * x3::kTileSide + pattern[m]];
        }
      }
    }
  }
}

void Exl3OutputBlocksKernel(const PackedMatrix& w, const float* HWY_RESTRICT xp,
                            int64_t tokens, int64_t block_begin,
                            int64_t block_end, float* HWY_RESTRICT y,
                            int64_t ldy, bool accumulate) {
  constexpr int kSide = x3::kTileSide;
  constexpr int kTilesPerBlock = x3::kHadamardSize / kSide;
  // Partial sums of 8 positions (one half-column run): at most 8 lanes.
  const hn::CappedTag<float, 8> df;
  const size_t lanes = hn::Lanes(df);
  const auto& columns = internal::Exl3SumColumns();
  const int64_t tiles_out = w.rows / kSide;
  const int64_t tile_words = int64_t{kSide} * w.exl3_bits;
  const auto* trellis = reinterpret_cast<const uint16_t*>(w.data);
  const auto* svh = reinterpret_cast<const uint16_t*>(w.scale) + w.cols;
  HWY_ALIGN float values[x3::kTileValues];
  HWY_ALIGN float partial[kMaxExl3Tokens][kTilesPerBlock][kPartialSums];
  float outputs[x3::kHadamardSize];
  for (int64_t block = block_begin; block < block_end; ++block) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::fill(&partial[t][0][0], &partial[t][0][0] + sizeof(partial[t]) / 4,
                0.0f);
    }
    for (int64_t tk = 0; tk < w.cols / kSide; ++tk) {
      for (int j = 0; j < kTilesPerBlock; ++j) {
        const int64_t tn = block * kTilesPerBlock + j;
        x3::DecodeTileStreamSimd(trellis + (tk * tiles_out + tn) * tile_words,
                                 w.exl3_bits, w.exl3_codebook, values);
        for (int64_t t = 0; t < tokens; ++t) {
          const float* xt = xp + 2 * t * w.cols + tk * kPatternValues;
          float* sums = partial[t][j];
          for (ptrdiff_t q = 0; q < kPartialSums / 8; ++q) {
            const float* v = values + q * kPatternValues;
            for (size_t l = 0; l < 8; l += lanes) {
              auto sum = hn::Load(df, sums + 8 * q + l);
              for (ptrdiff_t i = 0; i < kPatternValues / 8; ++i) {
                sum = hn::MulAdd(hn::Load(df, v + 8 * i + l),
                                 hn::LoadU(df, xt + 8 * i + l), sum);
              }
              hn::Store(sum, df, sums + 8 * q + l);
            }
          }
        }
      }
    }
    for (int64_t t = 0; t < tokens; ++t) {
      std::fill(outputs, outputs + x3::kHadamardSize, 0.0f);
      for (int j = 0; j < kTilesPerBlock; ++j) {
        for (int e = 0; e < kPartialSums; ++e) {
          outputs[j * kSide + columns[e]] += partial[t][j][e];
        }
      }
      x3::Hadamard128(outputs);
      float* out = y + t * ldy + block * x3::kHadamardSize;
      for (int c = 0; c < x3::kHadamardSize; ++c) {
        const float value =
            outputs[c] *
            formats::Fp16ToFloat(svh[block * x3::kHadamardSize + c]);
        out[c] = accumulate ? out[c] + value : value;
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mneme::gpu::codebook_kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::gpu::codebook_kernels {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(GridbookDotRowsKernel);
HWY_EXPORT(GridbookDecodeRowsKernel);
HWY_EXPORT(Exl3TransformInputKernel);
HWY_EXPORT(Exl3OutputBlocksKernel);

void GridbookDotRows(const PackedMatrix& w, const float* x, int64_t tokens,
                     int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
                     bool accumulate) {
  HWY_DYNAMIC_DISPATCH(GridbookDotRowsKernel)
  (w, x, tokens, row_begin, row_end, y, ldy, accumulate);
}

void GridbookDecodeRows(const PackedMatrix& w, int64_t begin, int64_t end,
                        float* out) {
  HWY_DYNAMIC_DISPATCH(GridbookDecodeRowsKernel)(w, begin, end, out);
}

void Exl3TransformInput(const PackedMatrix& w, const float* x, int64_t tokens,
                        float* xp) {
  HWY_DYNAMIC_DISPATCH(Exl3TransformInputKernel)(w, x, tokens, xp);
}

void Exl3OutputBlocks(const PackedMatrix& w, const float* xp, int64_t tokens,
                      int64_t block_begin, int64_t block_end, float* y,
                      int64_t ldy, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(Exl3OutputBlocksKernel)
  (w, xp, tokens, block_begin, block_end, y, ldy, accumulate);
}

void Exl3DecodeRows(const PackedMatrix& w, int64_t begin, int64_t end,
                    float* out) {
  const auto* scales = reinterpret_cast<const uint16_t*>(w.scale);
  formats::exl3::DequantizeOutputRows(
      {.in_features = w.cols,
       .out_features = w.rows,
       .bits = w.exl3_bits,
       .codebook = w.exl3_codebook,
       .trellis = reinterpret_cast<const uint16_t*>(w.data),
       .suh = scales,
       .svh = scales + w.cols},
      begin, end, out);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

}  // namespace mneme::gpu::codebook_kernels
#endif  // HWY_ONCE
