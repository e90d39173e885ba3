#include "formats/block_formats.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"

namespace mneme::formats {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t Fp8BlockScaleBytes(int64_t rows, int64_t cols, int block_rows,
                           int block_cols) {
  return CeilDiv(rows, block_rows) * CeilDiv(cols, block_cols);
}

void DequantizeFp8BlockRows(const uint8_t* codes, const uint8_t* scales,
                            int64_t cols, int block_rows, int block_cols,
                            int64_t begin, int64_t end, float* out) {
  const int64_t scales_per_row = CeilDiv(cols, block_cols);
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* row = codes + r * cols;
    const uint8_t* row_scales = scales + (r / block_rows) * scales_per_row;
    float* dst = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      dst[c] = E4m3ToFloat(row[c]) * Ue8m0ToFloat(row_scales[c / block_cols]);
    }
  }
}

void DequantizeMxfp4Rows(const uint8_t* packed, const uint8_t* scales,
                         int64_t cols, int64_t begin, int64_t end, float* out) {
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* pairs = packed + r * cols / 2;
    const uint8_t* row_scales = scales + r * (cols / kMxfp4GroupSize);
    float* dst = out + r * cols;
    for (int64_t c = 0; c < cols; c += 2) {
      const float s = Ue8m0ToFloat(row_scales[c / kMxfp4GroupSize]);
      dst[c] = E2m1ToFloat(pairs[c / 2]) * s;
      dst[c + 1] = E2m1ToFloat(pairs[c / 2] >> 4) * s;
    }
  }
}

void DequantizeNvfp4Rows(const uint8_t* packed, const uint8_t* scales,
                         float global_scale, int64_t cols, int64_t begin,
                         int64_t end, float* out) {
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* pairs = packed + r * cols / 2;
    const uint8_t* row_scales = scales + r * (cols / kNvfp4GroupSize);
    float* dst = out + r * cols;
    for (int64_t c = 0; c < cols; c += 2) {
      const float s = E4m3ToFloat(row_scales[c / kNvfp4GroupSize]);
      // (e2m1 * scale) * global_scale: the order of the Engram decoders.
      dst[c] = (E2m1ToFloat(pairs[c / 2]) * s) * global_scale;
      dst[c + 1] = (E2m1ToFloat(pairs[c / 2] >> 4) * s) * global_scale;
    }
  }
}

void Bf16RowsToFloat(const uint8_t* data, int64_t cols, int64_t begin,
                     int64_t end, float* out) {
  for (int64_t i = begin * cols; i < end * cols; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + i * 2, 2);
    out[i] = Bf16ToFloat(bits);
  }
}

int64_t FindE4m3Nan(const uint8_t* codes, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (std::isnan(E4m3ToFloat(codes[i]))) return i;
  }
  return -1;
}

int64_t FindUe8m0Nan(const uint8_t* codes, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (std::isnan(Ue8m0ToFloat(codes[i]))) return i;
  }
  return -1;
}

int64_t FindBf16Nan(const uint8_t* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + i * 2, 2);
    if (std::isnan(Bf16ToFloat(bits))) return i;
  }
  return -1;
}

int64_t FindF32Nan(const uint8_t* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float value;
    std::memcpy(&value, data + i * 4, 4);
    if (std::isnan(value)) return i;
  }
  return -1;
}

}  // namespace mneme::formats
