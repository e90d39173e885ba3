#include "formats/row_encode.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/row_format.h"
#include "formats/ue8m0.h"

namespace mneme::formats {
namespace {

absl::Status CheckSize(const char* what, size_t size, size_t expected) {
  if (size != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", size, " elements, expected ", expected));
  }
  return absl::OkStatus();
}

absl::Status CheckValues(absl::Span<const float> values) {
  RETURN_IF_ERROR(CheckSize("values", values.size(), kRowDim));
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("value ", i, " is not finite: ", values[i]));
    }
  }
  return absl::OkStatus();
}

float BlockAmax(const float* values, int count) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(values[i]));
  return amax;
}

// The smallest k in [-127, 127] with amax <= 448 * 2^k (amax finite >= 0).
int Fp8BlockExponent(float amax) {
  if (amax == 0.0f) return -127;
  int exponent;
  const float mantissa = std::frexp(amax, &exponent);  // amax = m * 2^exponent
  // 448 = 0.875 * 2^9, and m in [0.5, 1): m * 2^(exponent - k) <= 0.875 * 2^9
  // holds for k = exponent - 9 exactly when m <= 0.875, else k is one more.
  const int k = mantissa <= 0.875f ? exponent - 9 : exponent - 8;
  return std::max(k, -127);  // amax <= FLT_MAX < 448 * 2^120: no upper clamp
}

}  // namespace

absl::Status EncodeFp8Row(absl::Span<const float> values,
                          absl::Span<uint8_t> weights,
                          absl::Span<uint8_t> scales) {
  RETURN_IF_ERROR(CheckValues(values));
  RETURN_IF_ERROR(CheckSize("weights", weights.size(), kFp8WeightBytes));
  RETURN_IF_ERROR(CheckSize("scales", scales.size(), kFp8ScaleBytes));
  for (size_t block = 0; block < kFp8ScaleBytes; ++block) {
    const float* x = values.data() + block * kFp8BlockSize;
    const int k = Fp8BlockExponent(BlockAmax(x, kFp8BlockSize));
    scales[block] = static_cast<uint8_t>(k + 127);
    // 2^-k is a float for k in [-127, 127]; x * 2^-k rounds at most once.
    const float inverse = Ue8m0ToFloat(static_cast<uint8_t>(127 - k));
    for (int j = 0; j < kFp8BlockSize; ++j) {
      weights[block * kFp8BlockSize + j] = FloatToE4m3(x[j] * inverse);
    }
  }
  return absl::OkStatus();
}

absl::Status EncodeFp8Row(absl::Span<const float> values,
                          absl::Span<uint8_t> row) {
  RETURN_IF_ERROR(CheckSize("row", row.size(), RowBytes(RowFormat::kFp8)));
  return EncodeFp8Row(values, row.first(kFp8WeightBytes),
                      row.subspan(kFp8WeightBytes));
}

absl::Status EncodeNvfp4Row(absl::Span<const float> values, float global_scale,
                            absl::Span<uint8_t> weights,
                            absl::Span<uint8_t> scales) {
  if (!(std::isfinite(global_scale) && global_scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NVFP4 global_scale must be finite and > 0, got ", global_scale));
  }
  RETURN_IF_ERROR(CheckValues(values));
  RETURN_IF_ERROR(CheckSize("weights", weights.size(), kNvfp4WeightBytes));
  RETURN_IF_ERROR(CheckSize("scales", scales.size(), kNvfp4ScaleBytes));
  for (size_t block = 0; block < kNvfp4ScaleBytes; ++block) {
    const float* x = values.data() + block * kNvfp4BlockSize;
    const float amax = BlockAmax(x, kNvfp4BlockSize);
    const uint8_t scale = FloatToE4m3(amax / kE2m1Max / global_scale);
    scales[block] = scale;
    const float step = E4m3ToFloat(scale) * global_scale;
    uint8_t* packed = weights.data() + block * (kNvfp4BlockSize / 2);
    for (size_t j = 0; j < kNvfp4BlockSize / 2; ++j) {
      const uint8_t even = step == 0.0f ? 0 : FloatToE2m1(x[2 * j] / step);
      const uint8_t odd = step == 0.0f ? 0 : FloatToE2m1(x[2 * j + 1] / step);
      packed[j] = static_cast<uint8_t>(even | (odd << 4));
    }
  }
  return absl::OkStatus();
}

absl::Status EncodeNvfp4Row(absl::Span<const float> values, float global_scale,
                            absl::Span<uint8_t> row) {
  RETURN_IF_ERROR(CheckSize("row", row.size(), RowBytes(RowFormat::kNvfp4)));
  return EncodeNvfp4Row(values, global_scale, row.first(kNvfp4WeightBytes),
                        row.subspan(kNvfp4WeightBytes));
}

float Nvfp4GlobalScale(float table_amax) {
  if (table_amax == 0.0f) return 1.0f;
  return table_amax / (kE2m1Max * kE4m3Max);
}

}  // namespace mneme::formats
