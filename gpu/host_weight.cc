#include "gpu/host_weight.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"

namespace mneme::gpu {
namespace {

// Largest rows x cols of a weight.
constexpr int64_t kMaxWeightElements = int64_t{1} << 40;

bool IsE4m3Nan(uint8_t code) { return (code & 0x7Fu) == 0x7Fu; }
constexpr uint8_t kUe8m0Nan = 0xFF;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shape, byte-count and parameter checks of UploadWeight (InvalidArgument).
absl::Status CheckShape(const HostWeight& w) {
  switch (w.format) {
    case WeightFormat::kF32:
    case WeightFormat::kBf16:
    case WeightFormat::kFp8Block:
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("HostWeight.format is not a known WeightFormat: ",
                       static_cast<int>(w.format)));
  }
  const char* name = WeightFormatName(w.format);
  if (w.rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostWeight.rows must be > 0, got ", w.rows));
  }
  if (w.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostWeight.cols must be > 0, got ", w.cols));
  }
  if (w.rows > kMaxWeightElements / w.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight ", w.rows, " x ", w.cols, " exceeds 2^40 elements"));
  }
  if (w.format == WeightFormat::kMxfp4 && w.cols % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight.cols must be a multiple of 32 for mxfp4, got ", w.cols));
  }
  if (w.format == WeightFormat::kNvfp4 && w.cols % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight.cols must be a multiple of 16 for nvfp4, got ", w.cols));
  }
  if (w.format == WeightFormat::kFp8Block &&
      (w.block_rows <= 0 || w.block_cols <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostWeight block shape must be > 0 for fp8 block, got ",
                     w.block_rows, " x ", w.block_cols));
  }
  const int64_t elements = w.rows * w.cols;
  int64_t data_bytes = 0;
  int64_t scale_bytes = 0;
  switch (w.format) {
    case WeightFormat::kF32:
      data_bytes = elements * 4;
      break;
    case WeightFormat::kBf16:
      data_bytes = elements * 2;
      break;
    case WeightFormat::kFp8Block:
      data_bytes = elements;
      scale_bytes =
          CeilDiv(w.rows, w.block_rows) * CeilDiv(w.cols, w.block_cols);
      break;
    case WeightFormat::kMxfp4:
      data_bytes = elements / 2;
      scale_bytes = elements / 32;
      break;
    case WeightFormat::kNvfp4:
      data_bytes = elements / 2;
      scale_bytes = elements / 16;
      break;
    case WeightFormat::kUnspecified:
      break;
  }
  if (static_cast<int64_t>(w.data.size()) != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight.data holds ", w.data.size(), " bytes; a ", w.rows, " x ",
        w.cols, " ", name, " weight needs ", data_bytes));
  }
  if (static_cast<int64_t>(w.scale.size()) != scale_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight.scale holds ", w.scale.size(), " bytes; a ", w.rows, " x ",
        w.cols, " ", name, " weight needs ", scale_bytes));
  }
  if (w.format == WeightFormat::kNvfp4) {
    if (std::isnan(w.global_scale)) {
      return absl::DataLossError("HostWeight.global_scale is NaN");
    }
    if (std::isinf(w.global_scale)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HostWeight.global_scale must be finite, got ", w.global_scale));
    }
  }
  return absl::OkStatus();
}

// DataLoss for a NaN scale or weight value; the weight passed CheckHostWeight.
absl::Status CheckNans(const HostWeight& w) {
  const absl::Span<const uint8_t> data = w.data;
  const absl::Span<const uint8_t> scale = w.scale;
  switch (w.format) {
    case WeightFormat::kF32:
      for (size_t i = 0; i < data.size(); i += 4) {
        uint32_t bits;
        std::memcpy(&bits, data.data() + i, 4);
        if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
          return absl::DataLossError(
              absl::StrCat("HostWeight.data value ", i / 4, " is NaN"));
        }
      }
      break;
    case WeightFormat::kBf16:
      for (size_t i = 0; i < data.size(); i += 2) {
        uint16_t bits;
        std::memcpy(&bits, data.data() + i, 2);
        if ((bits & 0x7FFFu) > 0x7F80u) {
          return absl::DataLossError(
              absl::StrCat("HostWeight.data value ", i / 2, " is NaN"));
        }
      }
      break;
    case WeightFormat::kFp8Block:
      for (size_t i = 0; i < data.size(); ++i) {
        if (IsE4m3Nan(data[i])) {
          return absl::DataLossError(
              absl::StrCat("HostWeight.data value ", i, " is an e4m3 NaN"));
        }
      }
      [[fallthrough]];
    case WeightFormat::kMxfp4:
      for (size_t i = 0; i < scale.size(); ++i) {
        if (scale[i] == kUe8m0Nan) {
          return absl::DataLossError(absl::StrCat(
              "HostWeight.scale byte ", i, " is 0xFF, a NaN UE8M0 scale"));
        }
      }
      break;
    case WeightFormat::kNvfp4:
      for (size_t i = 0; i < scale.size(); ++i) {
        if (IsE4m3Nan(scale[i])) {
          return absl::DataLossError(absl::StrCat("HostWeight.scale byte ", i,
                                                  " is an e4m3 NaN scale"));
        }
      }
      break;
    case WeightFormat::kUnspecified:
      break;
  }
  return absl::OkStatus();
}

}  // namespace

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBf16:
      return "bf16";
    case WeightFormat::kFp8Block:
      return "fp8 block";
    case WeightFormat::kMxfp4:
      return "mxfp4";
    case WeightFormat::kNvfp4:
      return "nvfp4";
    case WeightFormat::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::Status ValidateHostWeight(const HostWeight& w) {
  if (absl::Status st = CheckShape(w); !st.ok()) return st;
  return CheckNans(w);
}

void DequantizeRows(const HostWeight& w, int64_t begin, int64_t end,
                    float* out) {
  const int64_t cols = w.cols;
  const uint8_t* data = w.data.data();
  const uint8_t* scale = w.scale.data();
  for (int64_t r = begin; r < end; ++r) {
    float* dst = out + r * cols;
    switch (w.format) {
      case WeightFormat::kF32:
        std::memcpy(dst, data + r * cols * 4, static_cast<size_t>(cols) * 4);
        break;
      case WeightFormat::kBf16:
        for (int64_t c = 0; c < cols; ++c) {
          uint16_t bits;
          std::memcpy(&bits, data + (r * cols + c) * 2, 2);
          dst[c] = formats::Bf16ToFloat(bits);
        }
        break;
      case WeightFormat::kFp8Block: {
        const uint8_t* codes = data + r * cols;
        const uint8_t* scales =
            scale + (r / w.block_rows) * CeilDiv(cols, w.block_cols);
        for (int64_t c = 0; c < cols; ++c) {
          dst[c] = formats::E4m3ToFloat(codes[c]) *
                   formats::Ue8m0ToFloat(scales[c / w.block_cols]);
        }
        break;
      }
      case WeightFormat::kMxfp4: {
        const uint8_t* pairs = data + r * cols / 2;
        const uint8_t* scales = scale + r * (cols / 32);
        for (int64_t c = 0; c < cols; c += 2) {
          const float s = formats::Ue8m0ToFloat(scales[c / 32]);
          dst[c] = formats::E2m1ToFloat(pairs[c / 2]) * s;
          dst[c + 1] = formats::E2m1ToFloat(pairs[c / 2] >> 4) * s;
        }
        break;
      }
      case WeightFormat::kNvfp4: {
        const uint8_t* pairs = data + r * cols / 2;
        const uint8_t* scales = scale + r * (cols / 16);
        // (e2m1 * scale) * global_scale: the order of the Engram decoders.
        for (int64_t c = 0; c < cols; c += 2) {
          const float s = formats::E4m3ToFloat(scales[c / 16]);
          dst[c] = (formats::E2m1ToFloat(pairs[c / 2]) * s) * w.global_scale;
          dst[c + 1] =
              (formats::E2m1ToFloat(pairs[c / 2] >> 4) * s) * w.global_scale;
        }
        break;
      }
      case WeightFormat::kUnspecified:
        break;
    }
  }
}

absl::StatusOr<std::vector<float>> DequantizeHostWeight(const HostWeight& w) {
  if (absl::Status st = ValidateHostWeight(w); !st.ok()) return st;
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

}  // namespace mneme::gpu
