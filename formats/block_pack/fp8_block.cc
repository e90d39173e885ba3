#include "formats/block_pack/fp8_block.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/e4m3.h"
#include "formats/ue8m0.h"

namespace mneme::formats {

void EncodeFp8BlockMatrix(absl::Span<const float> values, int64_t cols,
                          absl::Span<uint8_t> codes,
                          std::vector<uint8_t>* scales) {
  const int64_t rows = static_cast<int64_t>(values.size()) / cols;
  for (int64_t first_row = 0; first_row < rows; first_row += kFp8MatrixBlock) {
    const int64_t row_end = std::min(rows, first_row + kFp8MatrixBlock);
    for (int64_t first_col = 0; first_col < cols;
         first_col += kFp8MatrixBlock) {
      const int64_t col_end = std::min(cols, first_col + kFp8MatrixBlock);
      float amax = 0.0f;
      for (int64_t r = first_row; r < row_end; ++r) {
        for (int64_t c = first_col; c < col_end; ++c) {
          amax = std::max(amax, std::fabs(values[r * cols + c]));
        }
      }
      const uint8_t e = FloatToUe8m0(amax / kE4m3Max);
      scales->push_back(e);
      // 2^-(e - 127) exactly.
      const float inverse = Ue8m0ToFloat(static_cast<uint8_t>(254 - e));
      for (int64_t r = first_row; r < row_end; ++r) {
        for (int64_t c = first_col; c < col_end; ++c) {
          codes[r * cols + c] = FloatToE4m3(values[r * cols + c] * inverse);
        }
      }
    }
  }
}

float Fp8RowAmax(absl::Span<const uint8_t> weights,
                 absl::Span<const uint8_t> scales) {
  constexpr size_t kBlock = 32;
  float amax = 0.0f;
  for (size_t b = 0; b < scales.size(); ++b) {
    const uint8_t e = scales[b];
    uint8_t m = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      m = std::max<uint8_t>(m, weights[b * kBlock + j] & 0x7F);
    }
    if (m == 0x7F || e == 255) return std::numeric_limits<float>::quiet_NaN();
    const float v = E4m3ToFloat(m) * Ue8m0ToFloat(e);
    if (!std::isfinite(v)) return v;
    amax = std::max(amax, v);
  }
  return amax;
}

}  // namespace mneme::formats
