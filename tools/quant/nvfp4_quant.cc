#include "tools/quant/nvfp4_quant.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "formats/row_format.h"

namespace mneme::quant {

using formats::E4m3ToFloat;
using formats::FloatToE4m3;
using formats::kE2m1Max;

std::string QuantMethodName(const QuantMethod& method) {
  return absl::StrCat(method.feedback == ErrorFeedback::kGptq ? "gptq" : "rtn",
                      "-", method.scale == ScaleChoice::kMse ? "mse" : "amax");
}

absl::StatusOr<QuantMethod> ParseQuantMethod(absl::string_view name) {
  for (ErrorFeedback feedback : {ErrorFeedback::kGptq, ErrorFeedback::kNone}) {
    for (ScaleChoice scale : {ScaleChoice::kMse, ScaleChoice::kAmax}) {
      const QuantMethod method{feedback, scale};
      if (QuantMethodName(method) == name) return method;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown method '", name,
                   "' (expected one of gptq-mse|gptq-amax|rtn-mse|rtn-amax)"));
}

uint8_t AmaxBlockScale(float block_amax, float global_scale) {
  // The order of operations of EncodeNvfp4Row (row_encode.cc).
  return FloatToE4m3(block_amax / kE2m1Max / global_scale);
}

double BlockSquaredError(const float* values, uint8_t scale,
                         float global_scale) {
  const float step = E4m3ToFloat(scale) * global_scale;
  double sum = 0.0;
  for (int i = 0; i < kBlock; ++i) {
    const float q = Nvfp4Value(Nvfp4Code(values[i], step), scale, global_scale);
    const double d = static_cast<double>(values[i]) - q;
    sum += d * d;
  }
  return sum;
}

uint8_t ChooseBlockScale(const float* values, float global_scale,
                         ScaleChoice choice, bool* smaller) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(values[i]));
  const uint8_t amax_scale = AmaxBlockScale(amax, global_scale);
  if (smaller != nullptr) *smaller = false;
  if (choice == ScaleChoice::kAmax || amax_scale == 0) return amax_scale;
  // Positive e4m3 codes are ordered like their values, so the roundings of
  // [0.75 s, s] are exactly the codes from round(0.75 s) to round(s).
  const float s = amax / kE2m1Max / global_scale;
  const uint8_t lowest = FloatToE4m3(0.75f * s);
  uint8_t best = amax_scale;
  double best_error = BlockSquaredError(values, amax_scale, global_scale);
  for (int code = amax_scale - 1; code >= lowest && code > 0; --code) {
    const double error =
        BlockSquaredError(values, static_cast<uint8_t>(code), global_scale);
    if (error < best_error) {
      best_error = error;
      best = static_cast<uint8_t>(code);
    }
  }
  if (smaller != nullptr) *smaller = best != amax_scale;
  return best;
}

void QuantizeRowRtn(const float* values, float global_scale, ScaleChoice choice,
                    uint8_t* weights, uint8_t* scales, RowQuantStats* stats) {
  for (int block = 0; block < formats::kRowDim / kBlock; ++block) {
    const float* x = values + int64_t{block} * kBlock;
    bool smaller = false;
    const uint8_t scale = ChooseBlockScale(x, global_scale, choice, &smaller);
    scales[block] = scale;
    if (stats != nullptr && smaller) ++stats->smaller_scale_blocks;
    const float step = E4m3ToFloat(scale) * global_scale;
    uint8_t* packed = weights + int64_t{block} * (kBlock / 2);
    for (int j = 0; j < kBlock / 2; ++j) {
      const uint8_t even = Nvfp4Code(x[int64_t{2} * j], step);
      const uint8_t odd = Nvfp4Code(x[2 * j + 1], step);
      packed[j] = formats::PackE2m1Pair(even, odd);
    }
  }
}

void PackCodes(const uint8_t* codes, uint8_t* weights) {
  formats::PackE2m1Codes(absl::MakeConstSpan(codes, formats::kRowDim),
                         absl::MakeSpan(weights, formats::kRowDim / 2));
}

}  // namespace mneme::quant
