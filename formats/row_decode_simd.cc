// Highway decoders (see row_decode_kernels.h for the contract). This file is
// compiled once per SIMD target by hwy/foreach_target.h (it includes itself),
// and HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time.
//
// Both formats decode with integer arithmetic on 32-bit lanes (no tables, no
// gathers), so the same code runs on x86 (SSSE3..AVX-512), Arm (NEON, SVE)
// and Highway's portable EMU128 target. The single-lane SCALAR target (the
// fallback some compilers get instead of EMU128) runs the scalar reference.

#include <cstddef>
#include <cstdint>

#include "formats/row_decode_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/row_decode_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// Included after Highway: these are plain headers, guarded.
#include "formats/e4m3.h"
#include "formats/row_format.h"
#include "formats/ue8m0.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "StoreBf16Pairs and the FP8 code pairs assume little-endian lanes"
#endif

HWY_BEFORE_NAMESPACE();
namespace mneme::formats::row_decode_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t CurrentTarget() { return HWY_TARGET; }

#if HWY_TARGET == HWY_SCALAR
// Single-lane vectors cannot be repartitioned into 16-bit halves; the scalar
// reference is exactly this target's job.
void DecodeFp8ToF32(const EncodedRows& rows, float* HWY_RESTRICT out) {
  DecodeFp8ToF32Scalar(rows, out);
}
void DecodeFp8ToBf16(const EncodedRows& rows, uint16_t* HWY_RESTRICT out) {
  DecodeFp8ToBf16Scalar(rows, out);
}
void DecodeNvfp4ToF32(const EncodedRows& rows, float global_scale,
                      float* HWY_RESTRICT out) {
  DecodeNvfp4ToF32Scalar(rows, global_scale, out);
}
void DecodeNvfp4ToBf16(const EncodedRows& rows, float global_scale,
                       uint16_t* HWY_RESTRICT out) {
  DecodeNvfp4ToBf16Scalar(rows, global_scale, out);
}
#else

// Lane counts. FP8 to fp32 steps through up to 16 values; FP8 to bf16
// through twice the lanes (an even and an odd vector): 32 at most, one
// block. NVFP4 steps through up to 8 packed bytes, 16 values, one block.
using Fp8Tag = hn::CappedTag<float, 16>;
using Nvfp4Tag = hn::CappedTag<float, 8>;

// The quiet NaN every decoder returns for NaN codes (E4m3ToFloat's).
constexpr uint32_t kQuietNanBits = 0x7FC00000u;

// FloatToBf16 of each lane, in the upper 16 bits of a u32 lane (the lower 16
// bits are garbage): fp32 bits + 0x7FFF + lsb, or for NaN the bits with the
// quiet bit (bit 22) set.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF> > Bf16InUpperHalf(DF /*df*/,
                                                              hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1u));
  const auto rounded = hn::Add(bits, hn::Add(hn::Set(du32, 0x7FFFu), lsb));
  const auto quiet_nan = hn::Or(bits, hn::Set(du32, 0x00400000u));
  return hn::IfThenElse(hn::RebindMask(du32, hn::Ne(v, v)), quiet_nan, rounded);
}

// Stores the bf16 of 2 * Lanes(df) values given as their even-indexed and
// odd-indexed elements: u32 lane i holds elements 2i (low half) and 2i + 1
// (high half), which in memory is element order.
template <class DF>
HWY_INLINE void StoreBf16Pairs(DF df, hn::Vec<DF> even, hn::Vec<DF> odd,
                               uint16_t* HWY_RESTRICT out) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::Repartition<uint16_t, decltype(du32)> du16;
  const auto pairs =
      hn::Or(hn::ShiftRight<16>(Bf16InUpperHalf(df, even)),
             hn::And(Bf16InUpperHalf(df, odd), hn::Set(du32, 0xFFFF0000u)));
  hn::StoreU(hn::BitCast(du16, pairs), du16, out);
}

// E4m3ToFloat of e4m3 codes (0..255) held in u32 lanes.
template <class DF>
HWY_INLINE hn::Vec<DF> E4m3ToF32(DF df,
                                 hn::Vec<hn::RebindToUnsigned<DF> > code) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const auto magnitude = hn::And(code, hn::Set(du32, 0x7Fu));
  // Normal: exponent rebiased 7 -> 127, mantissa moved to the top 3 bits.
  const auto normal = hn::BitCast(
      df, hn::Add(hn::ShiftLeft<20>(magnitude), hn::Set(du32, 120u << 23)));
  // Subnormal (exponent 0): mantissa * 2^-9, exact. (Not by reinterpreting
  // the bits as an fp32 subnormal and scaling it: that would flush to zero
  // under a caller's denormals-are-zero mode, unlike the scalar table.)
  const auto mantissa = hn::BitCast(di32, hn::And(code, hn::Set(du32, 7u)));
  const auto subnormal =
      hn::Mul(hn::ConvertTo(df, mantissa), hn::Set(df, 0x1p-9f));
  const auto is_subnormal = hn::RebindMask(
      df, hn::Eq(hn::And(code, hn::Set(du32, 0x78u)), hn::Zero(du32)));
  const auto sign =
      hn::BitCast(df, hn::ShiftLeft<24>(hn::And(code, hn::Set(du32, 0x80u))));
  const auto value =
      hn::Or(hn::IfThenElse(is_subnormal, subnormal, normal), sign);
  const auto is_nan =
      hn::RebindMask(df, hn::Eq(magnitude, hn::Set(du32, 0x7Fu)));
  return hn::IfThenElse(is_nan, hn::BitCast(df, hn::Set(du32, kQuietNanBits)),
                        value);
}

// E2m1ToFloat of e2m1 codes (0..15) held in u32 lanes.
template <class DF>
HWY_INLINE hn::Vec<DF> E2m1ToF32(DF df,
                                 hn::Vec<hn::RebindToUnsigned<DF> > code) {
  const hn::RebindToUnsigned<DF> du32;
  const auto magnitude = hn::And(code, hn::Set(du32, 7u));
  // Codes 2..7 are (1 + m/2) * 2^(e-1): fp32 exponent e + 126, mantissa bit
  // 22 = m. Code 1 is 0.5 and code 0 is 0.
  const auto normal =
      hn::Add(hn::ShiftLeft<22>(magnitude), hn::Set(du32, 126u << 23));
  const auto half = hn::IfThenElseZero(hn::Eq(magnitude, hn::Set(du32, 1u)),
                                       hn::Set(du32, 0x3F000000u));
  const auto is_small =
      hn::Eq(hn::And(magnitude, hn::Set(du32, 6u)), hn::Zero(du32));
  const auto sign = hn::ShiftLeft<28>(hn::And(code, hn::Set(du32, 8u)));
  return hn::BitCast(df, hn::Or(hn::IfThenElse(is_small, half, normal), sign));
}

// The row pointers of row r.
const uint8_t* RowWeights(const EncodedRows& rows, size_t r) {
  return rows.weights + r * rows.weight_stride;
}
const uint8_t* RowScales(const EncodedRows& rows, size_t r) {
  return rows.scales + r * rows.scale_stride;
}

// Steps must tile blocks exactly; true for every power-of-two lane count the
// tags allow, checked in case a target ever reports another.
bool Fp8LanesOk() { return kFp8BlockSize % (2 * hn::Lanes(Fp8Tag())) == 0; }
bool Nvfp4LanesOk() {
  return kNvfp4BlockSize % (2 * hn::Lanes(Nvfp4Tag())) == 0;
}

void DecodeFp8ToF32(const EncodedRows& rows, float* HWY_RESTRICT out) {
  if (!Fp8LanesOk()) return DecodeFp8ToF32Scalar(rows, out);
  const Fp8Tag df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t lanes = hn::Lanes(df);
  for (size_t r = 0; r < rows.num_rows; ++r, out += kRowDim) {
    const uint8_t* weights = RowWeights(rows, r);
    const uint8_t* scales = RowScales(rows, r);
    for (size_t i = 0; i < static_cast<size_t>(kRowDim); i += lanes) {
      const auto scale = hn::Set(df, Ue8m0ToFloat(scales[i / kFp8BlockSize]));
      const auto code = hn::PromoteTo(du32, hn::LoadU(du8, weights + i));
      hn::StoreU(hn::Mul(E4m3ToF32(df, code), scale), df, out + i);
    }
  }
}

void DecodeFp8ToBf16(const EncodedRows& rows, uint16_t* HWY_RESTRICT out) {
  if (!Fp8LanesOk()) return DecodeFp8ToBf16Scalar(rows, out);
  const Fp8Tag df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Repartition<uint16_t, decltype(du32)> du16;
  const hn::Rebind<uint8_t, decltype(du16)> du8;
  const size_t step = hn::Lanes(du16);  // values per step: 2 * Lanes(df)
  for (size_t r = 0; r < rows.num_rows; ++r, out += kRowDim) {
    const uint8_t* weights = RowWeights(rows, r);
    const uint8_t* scales = RowScales(rows, r);
    for (size_t i = 0; i < static_cast<size_t>(kRowDim); i += step) {
      const auto scale = hn::Set(df, Ue8m0ToFloat(scales[i / kFp8BlockSize]));
      // Codes widened to u16 lanes; as u32 lanes, lane j holds code 2j in
      // its low half and code 2j + 1 in its high half.
      const auto pairs =
          hn::BitCast(du32, hn::PromoteTo(du16, hn::LoadU(du8, weights + i)));
      const auto even = hn::And(pairs, hn::Set(du32, 0xFFu));
      const auto odd = hn::ShiftRight<16>(pairs);
      StoreBf16Pairs(df, hn::Mul(E4m3ToF32(df, even), scale),
                     hn::Mul(E4m3ToF32(df, odd), scale), out + i);
    }
  }
}

// Calls store(df, even values, odd values, first element index) for each
// step of `lanes` packed bytes (2 * lanes values) of row r. The low nibble of
// a byte is the even element, the high nibble the odd one.
template <class Store>
HWY_INLINE void ForEachNvfp4Step(const EncodedRows& rows, size_t r,
                                 float global_scale, Store store) {
  const Nvfp4Tag df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t lanes = hn::Lanes(df);
  const auto global = hn::Set(df, global_scale);
  const uint8_t* weights = RowWeights(rows, r);
  const uint8_t* scales = RowScales(rows, r);
  for (size_t byte = 0; byte < kNvfp4WeightBytes; byte += lanes) {
    const size_t element = 2 * byte;
    const auto scale =
        hn::Set(df, E4m3ToFloat(scales[element / kNvfp4BlockSize]));
    const auto bytes = hn::PromoteTo(du32, hn::LoadU(du8, weights + byte));
    const auto even = E2m1ToF32(df, hn::And(bytes, hn::Set(du32, 0xFu)));
    const auto odd = E2m1ToF32(df, hn::ShiftRight<4>(bytes));
    // (e2m1 * scale) * global_scale: the order of the scalar reference.
    store(df, hn::Mul(hn::Mul(even, scale), global),
          hn::Mul(hn::Mul(odd, scale), global), element);
  }
}

void DecodeNvfp4ToF32(const EncodedRows& rows, float global_scale,
                      float* HWY_RESTRICT out) {
  if (!Nvfp4LanesOk()) return DecodeNvfp4ToF32Scalar(rows, global_scale, out);
  for (size_t r = 0; r < rows.num_rows; ++r, out += kRowDim) {
    ForEachNvfp4Step(rows, r, global_scale,
                     [out](auto df, auto even, auto odd, size_t element) {
                       hn::StoreInterleaved2(even, odd, df, out + element);
                     });
  }
}

void DecodeNvfp4ToBf16(const EncodedRows& rows, float global_scale,
                       uint16_t* HWY_RESTRICT out) {
  if (!Nvfp4LanesOk()) return DecodeNvfp4ToBf16Scalar(rows, global_scale, out);
  for (size_t r = 0; r < rows.num_rows; ++r, out += kRowDim) {
    ForEachNvfp4Step(rows, r, global_scale,
                     [out](auto df, auto even, auto odd, size_t element) {
                       StoreBf16Pairs(df, even, odd, out + element);
                     });
  }
}

#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace mneme::formats::row_decode_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::formats::row_decode_internal {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(DecodeFp8ToF32);
HWY_EXPORT(DecodeFp8ToBf16);
HWY_EXPORT(DecodeNvfp4ToF32);
HWY_EXPORT(DecodeNvfp4ToBf16);

void DecodeFp8ToF32Simd(const EncodedRows& rows, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeFp8ToF32)(rows, out);
}

void DecodeFp8ToBf16Simd(const EncodedRows& rows, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(DecodeFp8ToBf16)(rows, out);
}

void DecodeNvfp4ToF32Simd(const EncodedRows& rows, float global_scale,
                          float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4ToF32)(rows, global_scale, out);
}

void DecodeNvfp4ToBf16Simd(const EncodedRows& rows, float global_scale,
                           uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(DecodeNvfp4ToBf16)(rows, global_scale, out);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

bool SimdTargetIsVectorized() {
  const int64_t target = HWY_DYNAMIC_DISPATCH(CurrentTarget)();
  return target != HWY_SCALAR && target != HWY_EMU128;
}

}  // namespace mneme::formats::row_decode_internal
#endif  // HWY_ONCE
