// DecodeTileStreamSimd (see exl3.h). This file is compiled once per SIMD
// target by hwy/foreach_target.h (it includes itself), and
// HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time.
//
// A state is 16 bits of the tile's MSB-first stream; the stream is rewritten
// (a copy of at most 130 halves) so that each state's window is one
// little-endian 32-bit read, gathered for a vector of states at once, then
// the codebook value is a gather from the 65536-entry table.

#include <cstddef>
#include <cstdint>

#include "formats/exl3/exl3.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/exl3/exl3_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the reversed stream is read as little-endian 32-bit windows"
#endif

HWY_BEFORE_NAMESPACE();
namespace mneme::formats::exl3 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t CurrentTarget() { return HWY_TARGET; }

#if HWY_TARGET == HWY_SCALAR
void DecodeStream(const uint16_t* HWY_RESTRICT words, int bits,
                  const float* HWY_RESTRICT table,
                  float* HWY_RESTRICT values) {
  DecodeTileStream(words, bits, table, values);
}
#else
void DecodeStream(const uint16_t* HWY_RESTRICT words, int bits,
                  const float* HWY_RESTRICT table,
                  float* HWY_RESTRICT values) {
  // The stream as 16-bit halves h[0..L) (MSB-first: h[2i] is the high half
  // of 32-bit word i, the stored words[2i + 1]), extended to
  // E = (h[L - 1], h[0], ..., h[L - 1], pad) so that state j is the 16 bits
  // of E starting at bit s = (j + 1) bits (the first states wrap into the
  // prefix), and stored reversed: rev[n] = E[L + 1 - n]. Then the 32 bits
  // E[a] << 16 | E[a + 1], a = s / 16, are the little-endian read at rev
  // + (L - a), and the state is that window >> (16 - s % 16).
  const int halves = kTileSide * bits;  // L
  uint16_t rev[kTileSide * kMaxBits + 2];
  rev[0] = 0;
  for (int u = 0; u < halves / 2; ++u) {
    rev[halves - 1 - 2 * u] = words[2 * u];
    rev[halves - 2 * u] = words[2 * u + 1];
  }
  rev[halves + 1] = words[halves - 2];  // h[L - 1]
  const auto* base = reinterpret_cast<const uint32_t*>(rev);

  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::Rebind<float, decltype(du)> df;
  const size_t lanes = hn::Lanes(du);
  const auto k = hn::Set(di, bits);
  const auto last = hn::Set(di, halves);
  const auto low4 = hn::Set(du, 15u);
  const auto sixteen = hn::Set(du, 16u);
  const auto state_mask = hn::Set(du, 0xFFFFu);
  for (size_t j = 0; j < static_cast<size_t>(kTileValues); j += lanes) {
    const auto s = hn::Mul(hn::Iota(di, static_cast<int32_t>(j + 1)), k);
    // Byte offset 2 (L - a) of the window.
    const auto offset =
        hn::ShiftLeft<1>(hn::Sub(last, hn::ShiftRight<4>(s)));
    const auto window = hn::GatherOffset(du, base, offset);
    const auto shift = hn::Sub(sixteen, hn::And(hn::BitCast(du, s), low4));
    const auto state = hn::And(window >> shift, state_mask);
    hn::StoreU(hn::GatherIndex(df, table, hn::BitCast(di, state)), df,
               values + j);
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

void DecodeTileStreamSimd(const uint16_t* words, int bits, const float* table,
                          float* values) {
  HWY_DYNAMIC_DISPATCH(DecodeStream)(words, bits, table, values);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

}  // namespace mneme::formats::exl3
#endif  // HWY_ONCE
