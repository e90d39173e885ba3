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
#include <vector>

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

// Codes of a small float format with kExpBits exponent bits (bias
// 2^(kExpBits - 1) - 1), kManBits mantissa bits and a sign bit above them,
// one per u32 lane, as fp32 (exact; no NaN or infinity codes): a code with an
// exponent field > 0 becomes fp32 bits by moving its fields up and rebiasing
// the exponent, a subnormal one is mantissa * 2^(1 - bias - kManBits).
template <int kExpBits, int kManBits, class DF>
HWY_INLINE hn::Vec<DF> DecodeSmallFloat(DF df, VU<DF> codes) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr uint32_t kMagnitude = (1u << (kExpBits + kManBits)) - 1;
  constexpr uint32_t kSign = 1u << (kExpBits + kManBits);
  constexpr int kShift = 23 - kManBits;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto mag = hn::And(codes, hn::Set(du, kMagnitude));
  const auto normal =
      hn::BitCast(df, hn::Add(hn::ShiftLeft<kShift>(mag),
                              hn::Set(du, uint32_t{127 - kBias} << 23)));
  const auto subnormal = hn::Mul(
      hn::ConvertTo(df, hn::BitCast(di, mag)),
      hn::Set(df, 1.0f / static_cast<float>(1 << (kBias - 1 + kManBits))));
  const auto is_subnormal = hn::RebindMask(
      df, hn::Lt(hn::BitCast(di, mag), hn::Set(di, 1 << kManBits)));
  const auto sign = hn::BitCast(df, hn::ShiftLeft<31 - kExpBits - kManBits>(
                                        hn::And(codes, hn::Set(du, kSign))));
  return hn::Or(hn::IfThenElse(is_subnormal, subnormal, normal), sign);
}

// e4m3 (fn) and e2m1 codes.
template <class DF>
HWY_INLINE hn::Vec<DF> DecodeE4m3(DF df, VU<DF> codes) {
  return DecodeSmallFloat<4, 3>(df, codes);
}
template <class DF>
HWY_INLINE hn::Vec<DF> DecodeE2m1(DF df, VU<DF> codes) {
  return DecodeSmallFloat<2, 1>(df, codes);
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
    case WeightFormat::kExl3:      // codebook_kernels.h
    case WeightFormat::kGridbook:  // codebook_kernels.h
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

// ---- One token: the row's values are decoded into registers and multiplied
// there (no tile store); two accumulators.

float Bf16DotRow(const PackedMatrix& w, int64_t r,
                 const float* HWY_RESTRICT x) {
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = w.cols;
  const uint8_t* row = w.data + r * cols * 2;
  auto s0 = hn::Zero(df);
  auto s1 = hn::Zero(df);
  int64_t c = 0;
  for (; c + 2 * n <= cols; c += 2 * n) {
    s0 = hn::MulAdd(LoadBf16(df, row + c * 2), hn::LoadU(df, x + c), s0);
    s1 = hn::MulAdd(LoadBf16(df, row + (c + n) * 2), hn::LoadU(df, x + c + n),
                    s1);
  }
  for (; c + n <= cols; c += n) {
    s0 = hn::MulAdd(LoadBf16(df, row + c * 2), hn::LoadU(df, x + c), s0);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1)));
  for (; c < cols; ++c) sum += Bf16ToFloat(row + c * 2) * x[c];
  return sum;
}

float Fp8DotRow(const PackedMatrix& w, int64_t r, const float* HWY_RESTRICT x) {
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t cols = w.cols;
  const int64_t bc = w.block_cols;
  const int64_t scale_cols = (cols + bc - 1) / bc;
  const uint8_t* codes = w.data + r * cols;
  const uint8_t* scales = w.scale + (r / w.block_rows) * scale_cols;
  auto s0 = hn::Zero(df);
  auto s1 = hn::Zero(df);
  float tail = 0.0f;
  for (int64_t b = 0; b < scale_cols; ++b) {
    const float s = formats::Ue8m0ToFloat(scales[b]);
    const auto vs = hn::Set(df, s);
    const int64_t end = std::min(cols, (b + 1) * bc);
    int64_t c = b * bc;
    for (; c + 2 * n <= end; c += 2 * n) {
      s0 = hn::MulAdd(hn::Mul(DecodeE4m3(df, LoadBytes(df, codes + c)), vs),
                      hn::LoadU(df, x + c), s0);
      s1 = hn::MulAdd(hn::Mul(DecodeE4m3(df, LoadBytes(df, codes + c + n)), vs),
                      hn::LoadU(df, x + c + n), s1);
    }
    for (; c + n <= end; c += n) {
      s0 = hn::MulAdd(hn::Mul(DecodeE4m3(df, LoadBytes(df, codes + c)), vs),
                      hn::LoadU(df, x + c), s0);
    }
    for (; c < end; ++c) tail += formats::E4m3ToFloat(codes[c]) * s * x[c];
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1))) + tail;
}

// Twice the e2m1 values, as int8: the nibble's value through a byte shuffle.
// (Code 8, -0, is 0 here: the sign of a zero product cannot change a sum
// other than one of zeros.)
alignas(16) constexpr int8_t kE2m1Twice[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                               0, -1, -2, -3, -4, -6, -8, -12};

// MXFP4 (kGroup 32) / NVFP4 (kGroup 16) row times one token given as its even
// columns xe and odd columns xo (a packed byte's low and high nibbles).
template <int kGroup>
float Fp4DotRow(const PackedMatrix& w, int64_t r, const float* HWY_RESTRICT xe,
                const float* HWY_RESTRICT xo) {
  constexpr bool kNvfp4 = kGroup == 16;
  constexpr int64_t kGroupBytes = kGroup / 2;
  const int64_t cols = w.cols;
  const int64_t groups = cols / kGroup;
  const uint8_t* pairs = w.data + r * (cols / 2);
  const uint8_t* scales = w.scale + r * groups;
  auto scale_of = [&](int64_t g) {
    return kNvfp4 ? formats::E4m3ToFloat(scales[g])
                  : formats::Ue8m0ToFloat(scales[g]);
  };
  float tail = 0.0f;
  // Group g's bytes [begin, end) one by one.
  auto scalar = [&](int64_t g, int64_t begin, int64_t end) {
    const float s = scale_of(g);
    for (int64_t j = begin; j < end; ++j) {
      float lo = formats::E2m1ToFloat(pairs[j]) * s;
      float hi = formats::E2m1ToFloat(pairs[j] >> 4) * s;
      if (kNvfp4) {
        lo *= w.global_scale;
        hi *= w.global_scale;
      }
      tail += lo * xe[j] + hi * xo[j];
    }
  };
#if HWY_TARGET == HWY_SCALAR
  for (int64_t g = 0; g < groups; ++g) {
    scalar(g, g * kGroupBytes, (g + 1) * kGroupBytes);
  }
  return tail;
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // 16 fp32 lanes hold the whole e2m1 table: a nibble becomes its value in
  // one lane permute (vpermps), no integer conversion. 16 bytes a step: one
  // MXFP4 group, or two NVFP4 groups with a scale per half.
  static_assert(kGroupBytes == 16 || kGroupBytes == 8);
  alignas(64) static constexpr float kE2m1[16] = {
      0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const hn::Full512<float> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const auto table = hn::Load(df, kE2m1);
  const auto low_nibble = hn::Set(du, 0xFu);
  // NVFP4's global scale is folded into each group's: one multiply a group.
  const float global = kNvfp4 ? w.global_scale : 1.0f;
  // The 16 bytes from j times the token: low nibbles against the even
  // columns, high nibbles against the odd ones.
  auto dot16 = [&](int64_t j) HWY_ATTR {
    const auto codes = hn::PromoteTo(du, hn::LoadU(d8, pairs + j));
    const auto lo = hn::TableLookupLanes(
        table,
        hn::IndicesFromVec(df, hn::BitCast(di, hn::And(codes, low_nibble))));
    const auto hi = hn::TableLookupLanes(
        table,
        hn::IndicesFromVec(df, hn::BitCast(di, hn::ShiftRight<4>(codes))));
    return hn::MulAdd(hi, hn::LoadU(df, xo + j),
                      hn::Mul(lo, hn::LoadU(df, xe + j)));
  };
  // The scales of the 16 bytes from group g on.
  auto scale16 = [&](int64_t g) HWY_ATTR {
    if constexpr (kNvfp4) {
      return hn::IfThenElse(hn::FirstN(df, 8),
                            hn::Set(df, scale_of(g) * global),
                            hn::Set(df, scale_of(g + 1) * global));
    } else {
      return hn::Set(df, scale_of(g));
    }
  };
  constexpr int64_t kGroupsPerStep = 16 / kGroupBytes;
  auto s0 = hn::Zero(df);
  auto s1 = hn::Zero(df);
  int64_t g = 0;
  for (; g + 2 * kGroupsPerStep <= groups; g += 2 * kGroupsPerStep) {
    s0 = hn::MulAdd(dot16(g * kGroupBytes), scale16(g), s0);
    s1 = hn::MulAdd(dot16((g + kGroupsPerStep) * kGroupBytes),
                    scale16(g + kGroupsPerStep), s1);
  }
  for (; g < groups; ++g) scalar(g, g * kGroupBytes, (g + 1) * kGroupBytes);
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1))) + tail;
#else
  // Vectors of up to 16 bytes (32 values): one MXFP4 group, or two NVFP4
  // groups with a scale per half.
  const hn::CappedTag<float, 16> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const hn::Rebind<int8_t, decltype(df)> di8;
  const hn::RebindToSigned<decltype(df)> di32;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const hn::CappedTag<int8_t, 16> d16;
  const auto table = hn::LoadU(d16, kE2m1Twice);
  // NVFP4's global scale is folded into each group's: one multiply a group.
  const float global = kNvfp4 ? w.global_scale : 1.0f;
  auto s0 = hn::Zero(df);
  auto s1 = hn::Zero(df);
  bool odd = false;
  // n bytes from j: the doubled e2m1 values times x (low nibbles the even
  // columns, high nibbles the odd ones), then times half the scale, into
  // the two accumulators in turn.
  auto step = [&](int64_t j, hn::Vec<decltype(df)> half_scale) HWY_ATTR {
    const auto bytes = hn::LoadU(d8, pairs + j);
    const auto lo = hn::TableLookupBytes(
        table, hn::BitCast(di8, hn::And(bytes, hn::Set(d8, 0x0F))));
    const auto hi =
        hn::TableLookupBytes(table, hn::BitCast(di8, hn::ShiftRight<4>(bytes)));
    const auto vlo = hn::ConvertTo(df, hn::PromoteTo(di32, lo));
    const auto vhi = hn::ConvertTo(df, hn::PromoteTo(di32, hi));
    const auto t = hn::MulAdd(vhi, hn::LoadU(df, xo + j),
                              hn::Mul(vlo, hn::LoadU(df, xe + j)));
    if (odd) {
      s1 = hn::MulAdd(t, half_scale, s1);
    } else {
      s0 = hn::MulAdd(t, half_scale, s0);
    }
    odd = !odd;
  };
  int64_t g = 0;
  if (n == 2 * kGroupBytes) {
    // Two groups a vector (NVFP4 at 16 lanes).
    const auto first_half = hn::FirstN(df, static_cast<size_t>(kGroupBytes));
    for (; g + 2 <= groups; g += 2) {
      step(g * kGroupBytes,
           hn::IfThenElse(first_half, hn::Set(df, scale_of(g) * 0.5f * global),
                          hn::Set(df, scale_of(g + 1) * 0.5f * global)));
    }
  }
  for (; g < groups; ++g) {
    const int64_t end = (g + 1) * kGroupBytes;
    int64_t j = g * kGroupBytes;
    if (n <= kGroupBytes) {
      const auto half_scale = hn::Set(df, scale_of(g) * 0.5f * global);
      for (; j + n <= end; j += n) step(j, half_scale);
    }
    scalar(g, j, end);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(s0, s1))) + tail;
#endif
}

// One token: each row decoded in registers.
void DotRowsOneToken(const PackedMatrix& w, const float* HWY_RESTRICT x,
                     int64_t row_begin, int64_t row_end, float* HWY_RESTRICT y,
                     bool accumulate) {
  const int64_t cols = w.cols;
  // Reused by this thread's later calls: no allocation per call once grown.
  thread_local std::vector<float> split;
  const bool fp4 =
      w.format == WeightFormat::kMxfp4 || w.format == WeightFormat::kNvfp4;
  if (fp4) {
    // The token's even columns, then its odd ones.
    split.resize(static_cast<size_t>(cols));
    const int64_t half = cols / 2;
    for (int64_t j = 0; j < half; ++j) {
      split[j] = x[2 * j];
      split[half + j] = x[2 * j + 1];
    }
  }
  const float* xe = split.data();
  const float* xo = split.data() + cols / 2;
  for (int64_t r = row_begin; r < row_end; ++r) {
    float sum = 0.0f;
    switch (w.format) {
      case WeightFormat::kBf16:
        sum = Bf16DotRow(w, r, x);
        break;
      case WeightFormat::kFp8Block:
        sum = Fp8DotRow(w, r, x);
        break;
      case WeightFormat::kMxfp4:
        sum = Fp4DotRow<32>(w, r, xe, xo);
        break;
      case WeightFormat::kNvfp4:
        sum = Fp4DotRow<16>(w, r, xe, xo);
        break;
      case WeightFormat::kF32:
      case WeightFormat::kExl3:      // codebook_kernels.h
      case WeightFormat::kGridbook:  // codebook_kernels.h
      case WeightFormat::kUnspecified:
        break;
    }
    y[r] = accumulate ? y[r] + sum : sum;
  }
}

void DotRowsKernel(const PackedMatrix& w, const float* HWY_RESTRICT x,
                   int64_t tokens, int64_t row_begin, int64_t row_end,
                   float* HWY_RESTRICT y, int64_t ldy, bool accumulate) {
  if (tokens == 1) {
    DotRowsOneToken(w, x, row_begin, row_end, y, accumulate);
    return;
  }
  // Several tokens: each tile of a row decoded once into L1 for all.
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
