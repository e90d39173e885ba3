#include "gpu/cpu/codebook_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"

namespace mneme::gpu::codebook_kernels {
namespace {

namespace gb = formats::gridbook;
namespace x3 = formats::exl3;

float RowScale(const PackedMatrix& w, int64_t row) {
  if (w.gridbook_scheme.grid != gb::Grid::kFp8) return 1.0f;
  float scale;
  std::memcpy(&scale, w.scale + 4 * row, 4);
  return scale;
}

x3::Exl3Weight AsExl3(const PackedMatrix& w) {
  const auto* scales = reinterpret_cast<const uint16_t*>(w.scale);
  return {.in_features = w.cols,
          .out_features = w.rows,
          .bits = w.exl3_bits,
          .codebook = w.exl3_codebook,
          .trellis = reinterpret_cast<const uint16_t*>(w.data),
          .suh = scales,
          .svh = scales + w.cols};
}

}  // namespace

void GridbookDotRows(const PackedMatrix& w, const float* x, int64_t tokens,
                     int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
                     bool accumulate) {
  const int64_t type_size = gb::TypeSize(w.gridbook_scheme);
  const int64_t blocks = w.cols / gb::kSuperblock;
  float values[gb::kSuperblock];
  for (int64_t r = row_begin; r < row_end; ++r) {
    float sums[kMaxExl3Tokens] = {};
    const float row_scale = RowScale(w, r);
    for (int64_t t0 = 0; t0 < tokens; t0 += kMaxExl3Tokens) {
      const int64_t count = std::min(kMaxExl3Tokens, tokens - t0);
      std::fill(sums, sums + count, 0.0f);
      for (int64_t s = 0; s < blocks; ++s) {
        gb::DecodeSuperblock(w.gridbook_scheme, *w.gridbook_books,
                             w.data + (r * blocks + s) * type_size, row_scale,
                             values);
        for (int64_t t = 0; t < count; ++t) {
          const float* xs = x + (t0 + t) * w.cols + s * gb::kSuperblock;
          float sum = 0.0f;
          for (int i = 0; i < gb::kSuperblock; ++i) sum += xs[i] * values[i];
          sums[t] += sum;
        }
      }
      for (int64_t t = 0; t < count; ++t) {
        float& out = y[(t0 + t) * ldy + r];
        out = accumulate ? out + sums[t] : sums[t];
      }
    }
  }
}

void GridbookDecodeRows(const PackedMatrix& w, int64_t begin, int64_t end,
                        float* out) {
  const int64_t type_size = gb::TypeSize(w.gridbook_scheme);
  const int64_t blocks = w.cols / gb::kSuperblock;
  for (int64_t r = begin; r < end; ++r) {
    const float row_scale = RowScale(w, r);
    for (int64_t s = 0; s < blocks; ++s) {
      gb::DecodeSuperblock(w.gridbook_scheme, *w.gridbook_books,
                           w.data + (r * blocks + s) * type_size, row_scale,
                           out + (r - begin) * w.cols + s * gb::kSuperblock);
    }
  }
}

void Exl3TransformInput(const PackedMatrix& w, const float* x, int64_t tokens,
                        float* xh) {
  const auto* suh = reinterpret_cast<const uint16_t*>(w.scale);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < w.cols; ++c) {
      xh[t * w.cols + c] = x[t * w.cols + c] * formats::Fp16ToFloat(suh[c]);
    }
    for (int64_t b = 0; b < w.cols; b += x3::kHadamardSize) {
      x3::Hadamard128(xh + t * w.cols + b);
    }
  }
}

void Exl3OutputBlocks(const PackedMatrix& w, const float* xh, int64_t tokens,
                      int64_t block_begin, int64_t block_end, float* y,
                      int64_t ldy, bool accumulate) {
  constexpr int kSide = x3::kTileSide;
  constexpr int kTilesPerBlock = x3::kHadamardSize / kSide;
  const auto& table = x3::CodebookTable(w.exl3_codebook);
  const int64_t tiles_out = w.rows / kSide;
  const int64_t tile_words = int64_t{kSide} * w.exl3_bits;
  const auto* trellis = reinterpret_cast<const uint16_t*>(w.data);
  const auto* svh = reinterpret_cast<const uint16_t*>(w.scale) + w.cols;
  float tile[x3::kTileValues];
  float acc[kMaxExl3Tokens][x3::kHadamardSize];
  for (int64_t block = block_begin; block < block_end; ++block) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::fill(acc[t], acc[t] + x3::kHadamardSize, 0.0f);
    }
    for (int64_t tk = 0; tk < w.cols / kSide; ++tk) {
      for (int j = 0; j < kTilesPerBlock; ++j) {
        const int64_t tn = block * kTilesPerBlock + j;
        x3::DecodeTile(trellis + (tk * tiles_out + tn) * tile_words,
                       w.exl3_bits, table, tile);
        for (int64_t t = 0; t < tokens; ++t) {
          const float* xs = xh + t * w.cols + tk * kSide;
          float* out = acc[t] + ptrdiff_t{j} * kSide;
          for (int r = 0; r < kSide; ++r) {
            const float xv = xs[r];
            const float* row = tile + ptrdiff_t{r} * kSide;
            for (int c = 0; c < kSide; ++c) out[c] += xv * row[c];
          }
        }
      }
    }
    for (int64_t t = 0; t < tokens; ++t) {
      x3::Hadamard128(acc[t]);
      float* out = y + t * ldy + block * x3::kHadamardSize;
      for (int c = 0; c < x3::kHadamardSize; ++c) {
        const float value = acc[t][c] * formats::Fp16ToFloat(
                                            svh[block * x3::kHadamardSize + c]);
        out[c] = accumulate ? out[c] + value : value;
      }
    }
  }
}

void Exl3DecodeRows(const PackedMatrix& w, int64_t begin, int64_t end,
                    float* out) {
  x3::DequantizeOutputRows(AsExl3(w), begin, end, out);
}

}  // namespace mneme::gpu::codebook_kernels
