#include "gpu/host_weight.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/block_formats.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"

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
    case WeightFormat::kExl3:
    case WeightFormat::kGridbook:
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
  if (w.format == WeightFormat::kExl3) {
    RETURN_IF_ERROR(
        formats::exl3::ValidateExl3Shape(w.cols, w.rows, w.exl3_bits));
  }
  if (w.format == WeightFormat::kGridbook) {
    if (w.cols % formats::gridbook::kSuperblock != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HostWeight.cols must be a multiple of 256 for gridbook, got ",
          w.cols));
    }
    RETURN_IF_ERROR(formats::gridbook::ValidateScheme(w.gridbook_scheme));
    if (w.gridbook_books == nullptr) {
      return absl::InvalidArgumentError(
          "HostWeight.gridbook_books is missing for a gridbook weight");
    }
    RETURN_IF_ERROR(formats::gridbook::ValidateCodebooks(w.gridbook_scheme,
                                                         *w.gridbook_books));
    if (w.gridbook_input_scale != 0.0f &&
        w.gridbook_scheme.grid != formats::gridbook::Grid::kFp4) {
      return absl::InvalidArgumentError(
          "HostWeight.gridbook_input_scale is set on an fp8 scheme");
    }
  }
  if (w.gridbook_input_scale != 0.0f &&
      (!std::isfinite(w.gridbook_input_scale) ||
       w.gridbook_input_scale < 0.0f ||
       (w.format != WeightFormat::kGridbook &&
        w.format != WeightFormat::kF32))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostWeight.gridbook_input_scale must be 0 or a positive finite "
        "scale on a gridbook (fp4) or f32 weight, got ",
        w.gridbook_input_scale));
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
    case WeightFormat::kExl3:
      data_bytes = formats::exl3::TrellisBytes(w.cols, w.rows, w.exl3_bits);
      scale_bytes = 2 * (w.rows + w.cols);
      break;
    case WeightFormat::kGridbook:
      data_bytes = w.rows * (w.cols / formats::gridbook::kSuperblock) *
                   formats::gridbook::TypeSize(w.gridbook_scheme);
      scale_bytes = w.gridbook_scheme.grid == formats::gridbook::Grid::kFp8
                        ? w.rows * 4
                        : 0;
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

// DataLoss for a group or row scale that is not finite (a NaN e4m3 code, a
// two-tier exponent past the fp32 range, a NaN or infinite weight_scale).
absl::Status CheckGridbookScales(const HostWeight& w) {
  namespace gb = formats::gridbook;
  if (w.gridbook_scheme.grid == gb::Grid::kFp8) {
    for (int64_t r = 0; r < w.rows; ++r) {
      float value;
      std::memcpy(&value, w.scale.data() + 4 * r, 4);
      if (!std::isfinite(value)) {
        return absl::DataLossError(absl::StrCat(
            "HostWeight.scale (weight_scale) of row ", r, " is not finite"));
      }
    }
    return absl::OkStatus();
  }
  const int64_t type_size = gb::TypeSize(w.gridbook_scheme);
  const int64_t blocks = w.rows * (w.cols / gb::kSuperblock);
  float scales[gb::kSuperblock / gb::kGroupSize];
  for (int64_t b = 0; b < blocks; ++b) {
    gb::DecodeGroupScales(w.gridbook_scheme, w.data.data() + b * type_size,
                          scales);
    for (const float scale : scales) {
      if (!std::isfinite(scale)) {
        return absl::DataLossError(absl::StrCat(
            "HostWeight.data superblock ", b, " (row ",
            b / (w.cols / gb::kSuperblock), ") has a non-finite group scale"));
      }
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
    case WeightFormat::kExl3:
      for (int64_t i = 0; i < w.rows + w.cols; ++i) {
        uint16_t bits;
        std::memcpy(&bits, scale + 2 * i, 2);
        if (!std::isfinite(formats::Fp16ToFloat(bits))) {
          return absl::DataLossError(absl::StrCat(
              "HostWeight.scale ", i < w.cols ? "suh" : "svh", " value ",
              i < w.cols ? i : i - w.cols, " is not finite"));
        }
      }
      break;
    case WeightFormat::kGridbook:
      return CheckGridbookScales(w);
    case WeightFormat::kUnspecified:
      break;
  }
  return absl::OkStatus();
}

// EXL3 rows are made 128 at a time (the Hadamard block of the outputs): the
// blocks covering [begin, end), then the rows asked for.
void DequantizeExl3Rows(const HostWeight& w, int64_t begin, int64_t end,
                        float* out) {
  namespace x3 = formats::exl3;
  const x3::Exl3Weight weight{
      .in_features = w.cols,
      .out_features = w.rows,
      .bits = w.exl3_bits,
      .codebook = w.exl3_codebook,
      .trellis = reinterpret_cast<const uint16_t*>(w.data.data()),
      .suh = reinterpret_cast<const uint16_t*>(w.scale.data()),
      .svh = reinterpret_cast<const uint16_t*>(w.scale.data()) + w.cols};
  const int64_t first = begin / x3::kHadamardSize * x3::kHadamardSize;
  const int64_t last =
      (end + x3::kHadamardSize - 1) / x3::kHadamardSize * x3::kHadamardSize;
  if (first == begin && last == end) {
    x3::DequantizeOutputRows(weight, begin, end, out + begin * w.cols);
    return;
  }
  std::vector<float> block(static_cast<size_t>((last - first) * w.cols));
  x3::DequantizeOutputRows(weight, first, last, block.data());
  std::memcpy(out + begin * w.cols, block.data() + (begin - first) * w.cols,
              static_cast<size_t>((end - begin) * w.cols) * sizeof(float));
}

void DequantizeGridbookRows(const HostWeight& w, int64_t begin, int64_t end,
                            float* out) {
  namespace gb = formats::gridbook;
  const int64_t row_bytes =
      w.cols / gb::kSuperblock * gb::TypeSize(w.gridbook_scheme);
  for (int64_t r = begin; r < end; ++r) {
    float row_scale = 1.0f;
    if (w.gridbook_scheme.grid == gb::Grid::kFp8) {
      std::memcpy(&row_scale, w.scale.data() + 4 * r, 4);
    }
    for (int64_t s = 0; s < w.cols / gb::kSuperblock; ++s) {
      gb::DecodeSuperblock(
          w.gridbook_scheme, *w.gridbook_books,
          w.data.data() + r * row_bytes + s * gb::TypeSize(w.gridbook_scheme),
          row_scale, out + r * w.cols + s * gb::kSuperblock);
    }
  }
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
    case WeightFormat::kExl3:
      return "exl3";
    case WeightFormat::kGridbook:
      return "gridbook";
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
    case WeightFormat::kExl3:
      DequantizeExl3Rows(w, begin, end, out);
      break;
    case WeightFormat::kGridbook:
      DequantizeGridbookRows(w, begin, end, out);
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
