#include "gpu/host_weight.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/block_formats.h"

namespace mneme::gpu {
namespace {

// Largest rows x cols of a weight.
constexpr int64_t kMaxWeightElements = int64_t{1} << 40;

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
  if (w.format == WeightFormat::kMxfp4 &&
      w.cols % formats::kMxfp4GroupSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight.cols must be a multiple of 32 for mxfp4, got ", w.cols));
  }
  if (w.format == WeightFormat::kNvfp4 &&
      w.cols % formats::kNvfp4GroupSize != 0) {
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
      scale_bytes = formats::Fp8BlockScaleBytes(w.rows, w.cols, w.block_rows,
                                                w.block_cols);
      break;
    case WeightFormat::kMxfp4:
      data_bytes = formats::Fp4DataBytes(w.rows, w.cols);
      scale_bytes = formats::Mxfp4ScaleBytes(w.rows, w.cols);
      break;
    case WeightFormat::kNvfp4:
      data_bytes = formats::Fp4DataBytes(w.rows, w.cols);
      scale_bytes = formats::Nvfp4ScaleBytes(w.rows, w.cols);
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

// DataLoss for a NaN scale or weight value; the weight passed CheckShape.
absl::Status CheckNans(const HostWeight& w) {
  const uint8_t* data = w.data.data();
  const uint8_t* scale = w.scale.data();
  const int64_t elements = w.rows * w.cols;
  const int64_t scales = static_cast<int64_t>(w.scale.size());
  int64_t nan = -1;
  switch (w.format) {
    case WeightFormat::kF32:
      nan = formats::FindF32Nan(data, elements);
      if (nan >= 0) {
        return absl::DataLossError(
            absl::StrCat("HostWeight.data value ", nan, " is NaN"));
      }
      break;
    case WeightFormat::kBf16:
      nan = formats::FindBf16Nan(data, elements);
      if (nan >= 0) {
        return absl::DataLossError(
            absl::StrCat("HostWeight.data value ", nan, " is NaN"));
      }
      break;
    case WeightFormat::kFp8Block:
      nan = formats::FindE4m3Nan(data, elements);
      if (nan >= 0) {
        return absl::DataLossError(
            absl::StrCat("HostWeight.data value ", nan, " is an e4m3 NaN"));
      }
      [[fallthrough]];
    case WeightFormat::kMxfp4:
      nan = formats::FindUe8m0Nan(scale, scales);
      if (nan >= 0) {
        return absl::DataLossError(absl::StrCat("HostWeight.scale byte ", nan,
                                                " is 0xFF, a NaN UE8M0 scale"));
      }
      break;
    case WeightFormat::kNvfp4:
      nan = formats::FindE4m3Nan(scale, scales);
      if (nan >= 0) {
        return absl::DataLossError(absl::StrCat("HostWeight.scale byte ", nan,
                                                " is an e4m3 NaN scale"));
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
  RETURN_IF_ERROR(CheckShape(w));
  return CheckNans(w);
}

void DequantizeRows(const HostWeight& w, int64_t begin, int64_t end,
                    float* out) {
  if (end <= begin) return;
  const int64_t cols = w.cols;
  const uint8_t* data = w.data.data();
  const uint8_t* scale = w.scale.data();
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out + begin * cols, data + begin * cols * 4,
                  static_cast<size_t>((end - begin) * cols) * 4);
      break;
    case WeightFormat::kBf16:
      formats::Bf16RowsToFloat(data, cols, begin, end, out);
      break;
    case WeightFormat::kFp8Block:
      formats::DequantizeFp8BlockRows(data, scale, cols, w.block_rows,
                                      w.block_cols, begin, end, out);
      break;
    case WeightFormat::kMxfp4:
      formats::DequantizeMxfp4Rows(data, scale, cols, begin, end, out);
      break;
    case WeightFormat::kNvfp4:
      formats::DequantizeNvfp4Rows(data, scale, w.global_scale, cols, begin,
                                   end, out);
      break;
    case WeightFormat::kUnspecified:
      break;
  }
}

absl::StatusOr<std::vector<float>> DequantizeHostWeight(const HostWeight& w) {
  RETURN_IF_ERROR(ValidateHostWeight(w));
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  DequantizeRows(w, 0, w.rows, out.data());
  return out;
}

}  // namespace mneme::gpu
