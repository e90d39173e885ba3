#include "formats/row_decode.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "formats/row_decode_kernels.h"
#include "formats/row_format.h"

namespace mneme::formats {
namespace {

using row_decode_internal::EncodedRows;

absl::Status CheckOptions(const RowDecodeOptions& options) {
  if (options.format != RowFormat::kFp8 &&
      options.format != RowFormat::kNvfp4) {
    return absl::InvalidArgumentError(
        absl::StrCat("RowDecodeOptions.format must be fp8 or nvfp4, got ",
                     RowFormatName(options.format)));
  }
  if (options.format == RowFormat::kNvfp4 &&
      !(std::isfinite(options.global_scale) && options.global_scale >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RowDecodeOptions.global_scale must be finite and >= 0, "
                     "got ",
                     options.global_scale));
  }
  if (options.impl != DecodeImpl::kAuto &&
      options.impl != DecodeImpl::kScalar &&
      options.impl != DecodeImpl::kSimd) {
    return absl::InvalidArgumentError(
        absl::StrCat("RowDecodeOptions.impl is not a DecodeImpl: ",
                     static_cast<int>(options.impl)));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputSize(size_t num_rows, size_t out_size) {
  if (out_size != num_rows * kRowDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("output holds ", out_size, " values, ", num_rows,
                     " rows decode to ", num_rows * kRowDim));
  }
  return absl::OkStatus();
}

bool UseSimd(DecodeImpl impl) {
  return impl == DecodeImpl::kSimd ||
         (impl == DecodeImpl::kAuto &&
          row_decode_internal::SimdTargetIsVectorized());
}

// Runs the kernel for (format, output type, impl); arguments are checked.
void Run(const RowDecodeOptions& options, const EncodedRows& rows, float* out) {
  namespace k = row_decode_internal;
  const bool simd = UseSimd(options.impl);
  const float global_scale = options.global_scale;
  if (options.format == RowFormat::kFp8) {
    if (simd) {
      k::DecodeFp8ToF32Simd(rows, out);
    } else {
      k::DecodeFp8ToF32Scalar(rows, out);
    }
  } else if (simd) {
    k::DecodeNvfp4ToF32Simd(rows, global_scale, out);
  } else {
    k::DecodeNvfp4ToF32Scalar(rows, global_scale, out);
  }
}

void Run(const RowDecodeOptions& options, const EncodedRows& rows,
         uint16_t* out) {
  namespace k = row_decode_internal;
  const bool simd = UseSimd(options.impl);
  const float global_scale = options.global_scale;
  if (options.format == RowFormat::kFp8) {
    if (simd) {
      k::DecodeFp8ToBf16Simd(rows, out);
    } else {
      k::DecodeFp8ToBf16Scalar(rows, out);
    }
  } else if (simd) {
    k::DecodeNvfp4ToBf16Simd(rows, global_scale, out);
  } else {
    k::DecodeNvfp4ToBf16Scalar(rows, global_scale, out);
  }
}

template <typename T>
absl::Status DecodeRaw(const RowDecodeOptions& options,
                       absl::Span<const uint8_t> rows, absl::Span<T> out) {
  RETURN_IF_ERROR(CheckOptions(options));
  const size_t row_bytes = RowBytes(options.format);
  if (rows.size() % row_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw rows hold ", rows.size(), " bytes, not a multiple of ", row_bytes,
        " (one ", RowFormatName(options.format), " row)"));
  }
  const size_t num_rows = rows.size() / row_bytes;
  RETURN_IF_ERROR(CheckOutputSize(num_rows, out.size()));
  if (num_rows == 0) return absl::OkStatus();
  const EncodedRows encoded{
      .weights = rows.data(),
      .weight_stride = row_bytes,
      .scales = rows.data() + RowWeightBytes(options.format),
      .scale_stride = row_bytes,
      .num_rows = num_rows,
  };
  Run(options, encoded, out.data());
  return absl::OkStatus();
}

template <typename T>
absl::Status DecodeSplit(const RowDecodeOptions& options,
                         absl::Span<const uint8_t> weights,
                         absl::Span<const uint8_t> scales, absl::Span<T> out) {
  RETURN_IF_ERROR(CheckOptions(options));
  const size_t weight_bytes = RowWeightBytes(options.format);
  const size_t scale_bytes = RowScaleBytes(options.format);
  if (weights.size() % weight_bytes != 0 || scales.size() % scale_bytes != 0 ||
      weights.size() / weight_bytes != scales.size() / scale_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        RowFormatName(options.format), " weights (", weights.size(), " bytes, ",
        weight_bytes, " per row) and scales (", scales.size(), " bytes, ",
        scale_bytes, " per row) do not hold the same whole rows"));
  }
  const size_t num_rows = weights.size() / weight_bytes;
  RETURN_IF_ERROR(CheckOutputSize(num_rows, out.size()));
  if (num_rows == 0) return absl::OkStatus();
  const EncodedRows encoded{
      .weights = weights.data(),
      .weight_stride = weight_bytes,
      .scales = scales.data(),
      .scale_stride = scale_bytes,
      .num_rows = num_rows,
  };
  Run(options, encoded, out.data());
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeRowsF32(const RowDecodeOptions& options,
                           absl::Span<const uint8_t> rows,
                           absl::Span<float> out) {
  return DecodeRaw(options, rows, out);
}

absl::Status DecodeRowsBf16(const RowDecodeOptions& options,
                            absl::Span<const uint8_t> rows,
                            absl::Span<uint16_t> out) {
  return DecodeRaw(options, rows, out);
}

absl::Status DecodeRowsF32(const RowDecodeOptions& options,
                           absl::Span<const uint8_t> weights,
                           absl::Span<const uint8_t> scales,
                           absl::Span<float> out) {
  return DecodeSplit(options, weights, scales, out);
}

absl::Status DecodeRowsBf16(const RowDecodeOptions& options,
                            absl::Span<const uint8_t> weights,
                            absl::Span<const uint8_t> scales,
                            absl::Span<uint16_t> out) {
  return DecodeSplit(options, weights, scales, out);
}

const char* DecodeSimdTargetName() {
  return row_decode_internal::SimdTargetName();
}

}  // namespace mneme::formats
