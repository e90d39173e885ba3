#include "tools/quant/mxfp4_cast.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "formats/block_pack/fp4_pack.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"

namespace mneme::quant {

absl::StatusOr<int> MaxBlockExponent(absl::Span<const uint8_t> scales) {
  if (scales.empty()) return absl::InvalidArgumentError("no block scales");
  int code = 0;
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] == formats::kUe8m0Nan) {
      return absl::DataLossError(
          absl::StrCat("block scale ", i, " is NaN (UE8M0 255)"));
    }
    code = std::max<int>(code, scales[i]);
  }
  return formats::Ue8m0Exponent(static_cast<uint8_t>(code));
}

void CastStats::Add(const CastStats& o) {
  blocks += o.blocks;
  castable_blocks += o.castable_blocks;
  lossless_blocks += o.lossless_blocks;
  max_abs_error = std::max(max_abs_error, o.max_abs_error);
}

absl::Status CastMxfp4Tensor(int64_t rows, int64_t cols,
                             absl::Span<const uint8_t> packed,
                             absl::Span<const uint8_t> scales, int ws2_exponent,
                             absl::Span<uint8_t> out_packed,
                             absl::Span<uint8_t> out_scales, CastStats* stats,
                             std::vector<LossyBlock>* lossy, size_t max_lossy) {
  if (rows < 0 || cols <= 0 || cols % kMxfp4Block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MXFP4 tensor of ", rows, " x ", cols,
                     " values: columns must be a positive multiple of 32"));
  }
  const size_t blocks_per_row = static_cast<size_t>(cols / kMxfp4Block);
  const size_t n_packed = static_cast<size_t>(rows * cols / 2);
  const size_t n_scales = static_cast<size_t>(rows) * blocks_per_row;
  if (packed.size() != n_packed || out_packed.size() != n_packed ||
      scales.size() != n_scales || out_scales.size() != 2 * n_scales) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MXFP4 tensor of ", rows, " x ", cols, " values: buffer sizes ",
        packed.size(), "/", scales.size(), " -> ", out_packed.size(), "/",
        out_scales.size(), " do not match"));
  }
  if (ws2_exponent < -149 || ws2_exponent > 127) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_scale_2 exponent ", ws2_exponent,
                     " is not an fp32 power of two"));
  }
  const float ws2 = std::ldexp(1.0f, ws2_exponent);
  const uint8_t smallest = *E4m3PowerOfTwo(-9);
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < blocks_per_row; ++b) {
      const size_t block_index = r * blocks_per_row + b;
      const uint8_t e = scales[block_index];
      if (e == formats::kUe8m0Nan) {
        return absl::DataLossError(
            absl::StrCat("row ", r, ", block ", b, ": NaN scale (UE8M0 255)"));
      }
      const int k = formats::Ue8m0Exponent(e);
      const int p = k - ws2_exponent;
      if (p > 8) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", r, ", block ", b, ": exponent ", k,
                         " exceeds weight_scale_2 2^", ws2_exponent, " x 2^8"));
      }
      const std::optional<uint8_t> code = E4m3PowerOfTwo(p);
      const uint8_t block_scale = code.value_or(smallest);
      out_scales[2 * block_index] = block_scale;
      out_scales[2 * block_index + 1] = block_scale;
      const float source_scale = formats::Ue8m0ToFloat(e);
      const float target_scale = formats::E4m3ToFloat(block_scale);
      const size_t first_byte = block_index * (kMxfp4Block / 2);
      double block_error = 0.0;
      for (size_t j = 0; j < kMxfp4Block / 2; ++j) {
        const uint8_t byte = packed[first_byte + j];
        uint8_t out_byte = byte;
        if (!code.has_value()) {
          // Re-round both values to the smallest step.
          const float step = target_scale * ws2;
          const uint8_t lo = formats::FloatToE2m1(
              formats::E2m1ToFloat(formats::LowE2m1(byte)) * source_scale /
              step);
          const uint8_t hi = formats::FloatToE2m1(
              formats::E2m1ToFloat(formats::HighE2m1(byte)) * source_scale /
              step);
          out_byte = formats::PackE2m1Pair(lo, hi);
        }
        out_packed[first_byte + j] = out_byte;
        for (int half = 0; half < 2; ++half) {
          const uint8_t in_nibble = formats::E2m1OfPair(byte, half);
          const uint8_t out_nibble = formats::E2m1OfPair(out_byte, half);
          const float source = formats::E2m1ToFloat(in_nibble) * source_scale;
          const float target =
              (formats::E2m1ToFloat(out_nibble) * target_scale) * ws2;
          block_error = std::max(
              block_error, std::fabs(static_cast<double>(target) - source));
        }
      }
      ++stats->blocks;
      if (code.has_value()) ++stats->castable_blocks;
      if (block_error == 0.0) {
        ++stats->lossless_blocks;
      } else if (lossy != nullptr && lossy->size() < max_lossy) {
        lossy->push_back({r, static_cast<int64_t>(b), k, p, block_error});
      }
      stats->max_abs_error = std::max(stats->max_abs_error, block_error);
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::quant
