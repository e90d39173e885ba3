// DecodeTileStreamSimd (see exl3.h). This file is compiled once per SIMD
// target by hwy/foreach_target.h (it includes itself), and
// HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time.
//
// A state is 16 bits of the tile's MSB-first stream: a vector of states is
// cut from one unaligned load of the stream's words by two lane permutations
// and per-lane shifts (see DecodeStreamFor). The codebook value is then
// computed on the lanes (no table: a gather from the 256 KiB table misses L1
// for every value and took most of the time).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/exl3/exl3.h"
#include "formats/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/exl3/exl3_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the stream words are the little-endian reads of the int16 pairs"
#endif

HWY_BEFORE_NAMESPACE();
namespace mneme::formats::exl3 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t CurrentTarget() { return HWY_TARGET; }

#if HWY_TARGET == HWY_SCALAR
void DecodeStream(const uint16_t* HWY_RESTRICT words, int bits,
                  Codebook codebook, float* HWY_RESTRICT values) {
  DecodeTileStream(words, bits, codebook, values);
}

void Values(Codebook codebook, const uint16_t* HWY_RESTRICT states,
            int64_t count, float* HWY_RESTRICT values) {
  const auto& table = CodebookTable(codebook);
  for (int64_t i = 0; i < count; ++i) values[i] = table[states[i]];
}
#else

using DU = hn::ScalableTag<uint32_t>;
using DF = hn::Rebind<float, DU>;
using VU = hn::Vec<DU>;
using VF = hn::Vec<DF>;

// v << bits and v >> bits lane by lane (SVE's sizeless vectors have no
// operators in this Highway).
HWY_INLINE VU ShiftLeftLanes(VU v, VU bits) {
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || \
    HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
  return hn::Shl(v, bits);
#else
  return v << bits;
#endif
}

HWY_INLINE VU ShiftRightLanes(VU v, VU bits) {
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || \
    HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
  return hn::Shr(v, bits);
#else
  return v >> bits;
#endif
}

// fp32 bits of a normal fp16 value (exponent field 1..30) in the low 16 bits.
HWY_INLINE VU NormalFp16ToF32Bits(VU half) {
  const DU du;
  const auto sign = hn::ShiftLeft<16>(hn::And(half, hn::Set(du, 0x8000u)));
  const auto magnitude =
      hn::Add(hn::ShiftLeft<13>(hn::And(half, hn::Set(du, 0x7FFFu))),
              hn::Set(du, 112u << 23));  // rebias 15 -> 127
  return hn::Or(sign, magnitude);
}

// v rounded to nearest even at 11 significant bits (fp16's precision; v is
// zero, or not below 2^-14, or already exact: see CodebookValuesSimd).
HWY_INLINE VF RoundToFp16Precision(VF v) {
  const DU du;
  const auto bits = hn::BitCast(du, v);
  const auto odd = hn::And(hn::ShiftRight<13>(bits), hn::Set(du, 1u));
  const auto rounded = hn::Add(bits, hn::Add(hn::Set(du, 0xFFFu), odd));
  return hn::BitCast(DF(), hn::And(rounded, hn::Set(du, 0xFFFFE000u)));
}

// The MCG tail: each half keeps its sign and low exponent bits, its high
// exponent bits set (exponent field 12..15: a normal value in +-[1/8, 2)),
// and the halves are added in fp32 (exactly) and rounded once.
HWY_INLINE VF McgTail(VU x) {
  const DU du;
  const DF df;
  x = hn::Xor(hn::And(x, hn::Set(du, 0x8FFF8FFFu)), hn::Set(du, 0x3B603B60u));
  const auto low =
      hn::BitCast(df, NormalFp16ToF32Bits(hn::And(x, hn::Set(du, 0xFFFFu))));
  const auto high = hn::BitCast(df, NormalFp16ToF32Bits(hn::ShiftRight<16>(x)));
  return RoundToFp16Precision(hn::Add(low, high));
}

template <Codebook kCodebook>
HWY_INLINE VF CodebookVector(VU state) {
  const DU du;
  const DF df;
  if constexpr (kCodebook == Codebook::k3Inst) {
    return McgTail(hn::Add(hn::Mul(state, hn::Set(du, 89226354u)),
                           hn::Set(du, 64248484u)));
  } else if constexpr (kCodebook == Codebook::kMcg) {
    return McgTail(hn::Mul(state, hn::Set(du, 0xCBAC1FEDu)));
  } else {
    const auto x = hn::Mul(state, hn::Set(du, 0x83DCD12Du));
    const auto byte_mask = hn::Set(du, 0x00FF00FFu);
    const auto pairs = hn::Add(hn::And(x, byte_mask),
                               hn::And(hn::ShiftRight<8>(x), byte_mask));
    const auto sum = hn::Add(hn::And(pairs, hn::Set(du, 0xFFFFu)),
                             hn::ShiftRight<16>(pairs));
    const hn::RebindToSigned<DU> di;
    const auto h =
        hn::ConvertTo(df, hn::BitCast(di, hn::Add(sum, hn::Set(du, 1024u))));
    // fp16 0x1EEE and 0xC931: h * k_inv + k_bias is exact in fp32.
    return RoundToFp16Precision(hn::MulAdd(h, hn::Set(df, Fp16ToFloat(0x1EEEu)),
                                           hn::Set(df, Fp16ToFloat(0xC931u))));
  }
}

template <Codebook kCodebook>
HWY_INLINE void DecodeStreamFor(const uint16_t* HWY_RESTRICT words, int bits,
                                float* HWY_RESTRICT values) {
  // The stream's 32-bit words (MSB-first; word i is the little-endian read
  // of words[2i], words[2i + 1]) extended to ext = (w[n - 1], w[0], ...,
  // w[n - 1], zeros): state j is the 16 bits of ext starting at bit
  // s = (j + 1) bits + 16 (the first states wrap into the prefix). The
  // lanes' first words lie within floor((31 + (lanes - 1) bits) / 32) + 1
  // <= lanes - 2 words of the first lane's for every lane count >= 4 (bits
  // <= 8), so one unaligned load of ext at the first lane's word and two
  // lane permutations give each lane its word a = s / 32 and the next; the
  // window is ext[a] << o | ext[a + 1] >> (32 - o) with o = s % 32, and the
  // state its high half.
  constexpr int kMaxWords = kTileValues * kMaxBits / 32;
  const int words32 = kTileValues * bits / 32;  // n
  uint32_t ext[1 + kMaxWords + HWY_MAX_BYTES / 4];
  std::memcpy(ext + 1, words, sizeof(uint32_t) * words32);
  ext[0] = ext[words32];
  std::memset(ext + 1 + words32, 0, HWY_MAX_BYTES);

  const DU du;
  const hn::RebindToSigned<DU> di;
  const DF df;
  const size_t lanes = hn::Lanes(du);
  HWY_DASSERT(lanes >= 4);
  const auto k = hn::Set(di, bits);
  const auto low5 = hn::Set(du, 31u);
  const auto one = hn::Set(di, 1);
  for (size_t j = 0; j < static_cast<size_t>(kTileValues); j += lanes) {
    const int first = static_cast<int>((j + 1) * bits + 16) >> 5;
    const auto s = hn::Add(
        hn::Mul(hn::Iota(di, static_cast<int32_t>(j + 1)), k), hn::Set(di, 16));
    const auto local = hn::Sub(hn::ShiftRight<5>(s), hn::Set(di, first));
    const auto span = hn::LoadU(du, ext + first);
    const auto high = hn::TableLookupLanes(span, hn::IndicesFromVec(du, local));
    const auto low =
        hn::TableLookupLanes(span, hn::IndicesFromVec(du, hn::Add(local, one)));
    const auto o = hn::And(hn::BitCast(du, s), low5);
    // ext[a + 1] >> (32 - o) as (>> 1) >> (31 - o): no shift by 32.
    const auto window =
        hn::Or(ShiftLeftLanes(high, o),
               ShiftRightLanes(hn::ShiftRight<1>(low), hn::Sub(low5, o)));
    hn::StoreU(CodebookVector<kCodebook>(hn::ShiftRight<16>(window)), df,
               values + j);
  }
}

void DecodeStream(const uint16_t* HWY_RESTRICT words, int bits,
                  Codebook codebook, float* HWY_RESTRICT values) {
  switch (codebook) {
    case Codebook::k3Inst:
      return DecodeStreamFor<Codebook::k3Inst>(words, bits, values);
    case Codebook::kMcg:
      return DecodeStreamFor<Codebook::kMcg>(words, bits, values);
    case Codebook::kMul1:
      return DecodeStreamFor<Codebook::kMul1>(words, bits, values);
  }
}

template <Codebook kCodebook>
HWY_INLINE void ValuesFor(const uint16_t* HWY_RESTRICT states, int64_t count,
                          float* HWY_RESTRICT values) {
  const DU du;
  const DF df;
  const hn::Rebind<uint16_t, DU> du16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  int64_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const auto state = hn::PromoteTo(du, hn::LoadU(du16, states + i));
    hn::StoreU(CodebookVector<kCodebook>(state), df, values + i);
  }
  for (; i < count; ++i) {
    values[i] = Fp16ToFloat(CodebookValue(kCodebook, states[i]));
  }
}

void Values(Codebook codebook, const uint16_t* HWY_RESTRICT states,
            int64_t count, float* HWY_RESTRICT values) {
  switch (codebook) {
    case Codebook::k3Inst:
      return ValuesFor<Codebook::k3Inst>(states, count, values);
    case Codebook::kMcg:
      return ValuesFor<Codebook::kMcg>(states, count, values);
    case Codebook::kMul1:
      return ValuesFor<Codebook::kMul1>(states, count, values);
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace mneme::formats::exl3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::formats::exl3 {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(DecodeStream);
HWY_EXPORT(Values);

void DecodeTileStreamSimd(const uint16_t* words, int bits, Codebook codebook,
                          float* values) {
  HWY_DYNAMIC_DISPATCH(DecodeStream)(words, bits, codebook, values);
}

void CodebookValuesSimd(Codebook codebook, const uint16_t* states,
                        int64_t count, float* values) {
  HWY_DYNAMIC_DISPATCH(Values)(codebook, states, count, values);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

}  // namespace mneme::formats::exl3
#endif  // HWY_ONCE
