#include "gpu/host_weight.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engram_store/format/bf16.h"
#include "engram_store/format/e2m1.h"
#include "engram_store/format/e4m3.h"
#include "engram_store/format/ue8m0.h"

namespace mneme::gpu {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of the block scales, or -1 for a shape the format cannot hold.
int64_t ScaleBytes(const HostWeight& w) {
  switch (w.format) {
    case WeightFormat::kF32:
    case WeightFormat::kBf16:
      return 0;
    case WeightFormat::kFp8Block:
      if (w.block_rows <= 0 || w.block_cols <= 0) return -1;
      return CeilDiv(w.rows, w.block_rows) * CeilDiv(w.cols, w.block_cols);
    case WeightFormat::kMxfp4:
      return w.cols % 32 == 0 ? w.rows * (w.cols / 32) : -1;
    case WeightFormat::kNvfp4:
      return w.cols % 16 == 0 ? w.rows * (w.cols / 16) : -1;
    case WeightFormat::kUnspecified:
      break;
  }
  return -1;
}

}  // namespace

int64_t WeightDataBytes(WeightFormat format, int64_t rows, int64_t cols) {
  switch (format) {
    case WeightFormat::kF32:
      return rows * cols * 4;
    case WeightFormat::kBf16:
      return rows * cols * 2;
    case WeightFormat::kFp8Block:
      return rows * cols;
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4:
      return rows * cols / 2;
    case WeightFormat::kUnspecified:
      break;
  }
  return -1;
}

absl::Status ValidateHostWeight(const HostWeight& w) {
  if (w.format == WeightFormat::kUnspecified ||
      WeightDataBytes(w.format, 1, 2) < 0) {
    return absl::InvalidArgumentError("weight format is unspecified");
  }
  if (w.rows <= 0 || w.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight shape [", w.rows, ", ", w.cols, "] must be positive"));
  }
  if ((w.format == WeightFormat::kMxfp4 || w.format == WeightFormat::kNvfp4) &&
      w.cols % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp4 weight has an odd column count ", w.cols));
  }
  const int64_t scale_bytes = ScaleBytes(w);
  if (scale_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight shape [", w.rows, ", ", w.cols,
                     "] does not fit its format's scale blocks (block ",
                     w.block_rows, "x", w.block_cols, ")"));
  }
  const int64_t data_bytes = WeightDataBytes(w.format, w.rows, w.cols);
  if (static_cast<int64_t>(w.data.size()) != data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight [", w.rows, ", ", w.cols, "] needs ", data_bytes,
                     " data bytes, got ", w.data.size()));
  }
  if (static_cast<int64_t>(w.scale.size()) != scale_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight [", w.rows, ", ", w.cols, "] needs ", scale_bytes,
                     " scale bytes, got ", w.scale.size()));
  }
  for (size_t i = 0; i < w.scale.size(); ++i) {
    const uint8_t s = w.scale[i];
    const bool nan =
        w.format == WeightFormat::kNvfp4 ? (s & 0x7F) == 0x7F : s == 0xFF;
    if (nan) {
      return absl::DataLossError(absl::StrCat(
          "weight scale byte ", i, " is NaN (0x", absl::Hex(s), ")"));
    }
  }
  if (w.format == WeightFormat::kNvfp4 && !std::isfinite(w.global_scale)) {
    return absl::DataLossError("NVFP4 global scale is not finite");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DequantizeHostWeight(const HostWeight& w) {
  if (absl::Status st = ValidateHostWeight(w); !st.ok()) return st;
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  const uint8_t* d = w.data.data();
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out.data(), d, out.size() * 4);
      break;
    case WeightFormat::kBf16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, d + 2 * i, 2);
        out[i] = engram::Bf16ToFloat(bits);
      }
      break;
    case WeightFormat::kFp8Block: {
      const int64_t scale_cols = CeilDiv(w.cols, w.block_cols);
      for (int64_t r = 0; r < w.rows; ++r) {
        const uint8_t* srow = w.scale.data() + (r / w.block_rows) * scale_cols;
        for (int64_t c = 0; c < w.cols; ++c) {
          out[r * w.cols + c] = engram::E4m3ToFloat(d[r * w.cols + c]) *
                                engram::Ue8m0ToFloat(srow[c / w.block_cols]);
        }
      }
      break;
    }
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4: {
      const bool mx = w.format == WeightFormat::kMxfp4;
      const int64_t block = mx ? 32 : 16;
      const int64_t scales_per_row = w.cols / block;
      for (int64_t r = 0; r < w.rows; ++r) {
        for (int64_t c = 0; c < w.cols; ++c) {
          const uint8_t byte = d[(r * w.cols + c) / 2];
          const uint8_t code = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
          const uint8_t s = w.scale[r * scales_per_row + c / block];
          const float scale = mx ? engram::Ue8m0ToFloat(s)
                                 : engram::E4m3ToFloat(s) * w.global_scale;
          out[r * w.cols + c] = engram::E2m1ToFloat(code) * scale;
        }
      }
      break;
    }
    case WeightFormat::kUnspecified:
      break;
  }
  return out;
}

}  // namespace mneme::gpu
