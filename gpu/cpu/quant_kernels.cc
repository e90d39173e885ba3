// Highway kernels of quant_kernels.h. This file is compiled once per SIMD
// target by hwy/foreach_target.h (it includes itself), and
// HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time
// (the pattern of cpu_kernels.cc).
//
// The decoders build each fp32 value from its code with integer operations,
// exactly: e4m3 codes with an exponent field > 0 become fp32 bits by moving
// the exponent and mantissa fields and rebiasing (7 -> 127), the subnormal
// ones (exponent field 0) are mantissa * 2^-9; e2m1 likewise (bias 1, the
// subnormal being mantissa * 0.5); bf16 is the high half of fp32. Then the
// block scale multiplies (one rounding, as in formats/block_formats.cc).

#include "gpu/cpu/quant_kernels.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "gpu/cpu/quant_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mneme::gpu::quant_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A row is decoded kTileColumns values at a time into a buffer on the stack
// (2 KiB: it stays in L1 while every token of the pass reads it), so each
// weight byte is read from memory once per kTokensPerPass tokens. A multiple
// of both fp4 group sizes.
constexpr int64_t kTileColumns = 512;
constexpr int64_t kTokensPerPass = 16;

int64_t CurrentTarget() { return HWY_TARGET; }

template <class DF>
using VU = hn::Vec<hn::RebindToUnsigned<DF>>;

// e4m3 (fn) codes, one per u32 lane, as fp32 (exact; no NaN codes).
template <class DF>
HWY_INLINE hn::Vec<DF> DecodeE4m3(DF df, VU<DF> codes) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto mag = hn::And(codes, hn::Set(du, 0x7Fu));
  const auto normal = hn::BitCast(
      df, hn::Add(hn::ShiftLeft<20>(mag), hn::Set(du, uint32_t{120} << 23)));
  const auto subnormal = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mag)),
                                 hn::Set(df, 1.0f / 512.0f));
  const auto is_subnormal =
      hn::RebindMask(df, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 8)));
  const auto sign =
      hn::BitCast(df, hn::ShiftLeft<24>(hn::And(codes, hn::Set(du, 0x80u))));
  return hn::Or(hn::IfThenElse(is_subnormal, subnormal, normal), sign);
}

// e2m1 codes (0..15), one per u32 lane, as fp32 (exact).
template <class DF>
HWY_INLINE hn::Vec<DF> DecodeE2m1(DF df, VU<DF> codes) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto mag = hn::And(codes, hn::Set(du, 7u));
  const auto normal = hn::BitCast(
      df, hn::Add(hn::ShiftLeft<22>(mag), hn::Set(du, uint32_t{126} << 23)));
  const auto subnormal =
      hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mag)), hn::Set(df, 0.5f));
  const auto is_subnormal =
      hn::RebindMask(df, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 2)));
  const auto sign =
      hn::BitCast(df, hn::ShiftLeft<28>(hn::And(codes, hn::Set(du, 8u))));
  return hn::Or(hn::IfThenElse(is_subnormal, subnormal, normal), sign);
}

// Lanes(df) bytes from p, one per u32 lane.
template <class DF>
HWY_INLINE VU<DF> LoadBytes(DF /*df*/, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<uint8_t, DF> d8;
  return hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(d8, p));
}

// Lanes(df) bf16 values from p (little-endian pairs of bytes) as fp32.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadBf16(DF df, const uint8_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, DF> d16;
  const auto halves = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p));
  return hn::BitCast(
      df, hn::ShiftLeft<16>(hn::PromoteTo(hn::RebindToUnsigned<DF>(), halves)));
}

inline float Bf16ToFloat(const uint8_t* p) {
  uint16_t half = 0;
  std::memcpy(&half, p, sizeof(half));
  const uint32_t bits = uint32_t{half} << 16;
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Columns [begin, end) of row r of w as fp32 into out[0, end - begin). For
// the fp4 formats begin and end are multiples of the group size.
void DecodeSpan(const PackedMatrix& w, int64_t r, int64_t begin, int64_t end,
                float* HWY_RESTRICT out) {
  const int64_t cols = w.cols;
  switch (w.format) {
    case WeightFormat::kBf16: {
      const hn::ScalableTag<float> df;
      const int64_t n = static_cast<int64_t>(hn::Lanes(df));
      const uint8_t* row = w.data + r * cols * 2;
      int64_t c = begin;
      for (; c + n <= end; c += n) {
        hn::StoreU(LoadBf16(df, row + c * 2), df, out + (c - begin));
      }
      for (; c < end; ++c) out[c - begin] = Bf16ToFloat(row + c * 2);
      break;
    }
    case WeightFormat::kFp8Block: {
      const hn::ScalableTag<float> df;
      const int64_t n = static_cast<int64_t>(hn::Lanes(df));
      const int64_t bc = w.block_cols;
      const int64_t scale_cols = (cols + bc - 1) / bc;
      const uint8_t* codes = w.data + r * cols;
      const uint8_t* scales = w.scale + (r / w.block_rows) * scale_cols;
      for (int64_t b = begin / bc; b * bc < end; ++b) {
        const float s = formats::Ue8m0ToFloat(scales[b]);
        const auto vs = hn::Set(df, s);
        const int64_t block_end = std::min(end, (b + 1) * bc);
        int64_t c = std::max(begin, b * bc);
        for (; c + n <= block_end; c += n) {
          hn::StoreU(hn::Mul(DecodeE4m3(df, LoadBytes(df, codes + c)), vs), df,
                     out + (c - begin));
        }
        for (; c < block_end; ++c) {
          out[c - begin] = formats::E4m3ToFloat(codes[c]) * s;
        }
      }
      break;
    }
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4: {
      const bool nvfp4 = w.format == WeightFormat::kNvfp4;
      const int64_t group = nvfp4 ? 16 : 32;
      // Vectors of at most 8 bytes (16 values): never wider than a group.
      const hn::CappedTag<float, 8> df;
      const hn::RebindToUnsigned<decltype(df)> du;
      const int64_t n = static_cast<int64_t>(hn::Lanes(df));
      const uint8_t* pairs = w.data + r * (cols / 2);
      const uint8_t* scales = w.scale + r * (cols / group);
      const auto global = hn::Set(df, w.global_scale);
      for (int64_t g = begin / group; g < end / group; ++g) {
        const float s = nvfp4 ? formats::E4m3ToFloat(scales[g])
                              : formats::Ue8m0ToFloat(scales[g]);
        const auto vs = hn::Set(df, s);
        const int64_t group_end = (g + 1) * group / 2;
        int64_t j = g * group / 2;
        for (; j + n <= group_end; j += n) {
          const auto bytes = LoadBytes(df, pairs + j);
          auto lo =
              hn::Mul(DecodeE2m1(df, hn::And(bytes, hn::Set(du, 0xFu))), vs);
          auto hi = hn::Mul(DecodeE2m1(df, hn::ShiftRight<4>(bytes)), vs);
          if (nvfp4) {
            // (e2m1 * scale) * global_scale, as formats/block_formats.cc.
            lo = hn::Mul(lo, global);
            hi = hn::Mul(hi, global);
          }
          hn::StoreInterleaved2(lo, hi, df, out + (2 * j - begin));
        }
        for (; j < group_end; ++j) {
          float lo = formats::E2m1ToFloat(pairs[j]) * s;
          float hi = formats::E2m1ToFloat(pairs[j] >> 4) * s;
          if (nvfp4) {
            lo *= w.global_scale;
            hi *= w.global_scale;
          }
          out[2 * j - begin] = lo;
          out[2 * j + 1 - begin] = hi;
        }
      }
      break;
    }
    case WeightFormat::kF32:
    case WeightFormat::kUnspecified:
      break;
  }
}

// sum_i a[i] * b[i] in two vector accumulators.
float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
          int64_t count) {
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  auto s0 = hn::Zero(df);
  auto s1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * n <= count; i += 2 * n) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(df, a + i + n), hn::LoadU(df, b + i + n), s1);
  }
  for (; i + n <= count; i += n) {
    s0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), s0);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
  for (; i < count; ++i) sum += a[i] * b[i];
  return sum;
}

void DotRowsKernel(const PackedMatrix& w, const float* HWY_RESTRICT x,
                   int64_t tokens, int64_t row_begin, int64_t row_end,
                   float* HWY_RESTRICT y, int64_t ldy, bool accumulate) {
  HWY_ALIGN float tile[kTileColumns];
  const int64_t cols = w.cols;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t t0 = 0; t0 < tokens; t0 += kTokensPerPass) {
      const int64_t group = std::min(kTokensPerPass, tokens - t0);
      float sums[kTokensPerPass] = {};
      for (int64_t c = 0; c < cols; c += kTileColumns) {
        const int64_t len = std::min(kTileColumns, cols - c);
        DecodeSpan(w, r, c, c + len, tile);
        for (int64_t t = 0; t < group; ++t) {
          sums[t] += Dot(tile, x + (t0 + t) * cols + c, len);
        }
      }
      for (int64_t t = 0; t < group; ++t) {
        float& out = y[(t0 + t) * ldy + r];
        out = accumulate ? out + sums[t] : sums[t];
      }
    }
  }
}

void DecodeRowsKernel(const PackedMatrix& w, int64_t begin, int64_t end,
                      float* HWY_RESTRICT out) {
  for (int64_t r = begin; r < end; ++r) {
    DecodeSpan(w, r, 0, w.cols, out + (r - begin) * w.cols);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mneme::gpu::quant_kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::gpu::quant_kernels {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(DotRowsKernel);
HWY_EXPORT(DecodeRowsKernel);

void DotRows(const PackedMatrix& w, const float* x, int64_t tokens,
             int64_t row_begin, int64_t row_end, float* y, int64_t ldy,
             bool accumulate) {
  HWY_DYNAMIC_DISPATCH(DotRowsKernel)
  (w, x, tokens, row_begin, row_end, y, ldy, accumulate);
}

void DecodeRows(const PackedMatrix& w, int64_t begin, int64_t end, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeRowsKernel)(w, begin, end, out);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

}  // namespace mneme::gpu::quant_kernels
#endif  // HWY_ONCE
