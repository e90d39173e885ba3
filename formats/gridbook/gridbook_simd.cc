// DecodeSuperblockSimd (see gridbook.h). This file is compiled once per SIMD
// target by hwy/foreach_target.h (it includes itself), and
// HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time.
//
// The codewords are read in place (the reference copies the index bytes
// first); the table rows are copied with the row width known at compile time
// (one instantiation per sub-table count), and the scale pass (fp4 group
// scales; fp8 row scale and the bf16 rounding of the decode contract) runs on
// vectors.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/gridbook/gridbook.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/gridbook/gridbook_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mneme::formats::gridbook {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t CurrentTarget() { return HWY_TARGET; }

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codewords are little-endian 8-byte reads"
#endif

#if HWY_TARGET == HWY_SCALAR
void Decode(const Scheme& scheme, const Codebooks& books,
            const uint8_t* HWY_RESTRICT block, float row_scale,
            float* HWY_RESTRICT out) {
  DecodeSuperblock(scheme, books, block, row_scale, out);
}
#else

// Product mode with kSub sub-tables: codeword v's 8 values are the rows
// sub_i[index_i] (8 / kSub values each), sub 0 in the low bits.
template <int kSub>
HWY_INLINE void CopyProductRows(const Scheme& scheme, const Codebooks& books,
                                const uint64_t* HWY_RESTRICT codewords,
                                float* HWY_RESTRICT values) {
  constexpr int kColumns = kVectorDim / kSub;
  const float* tables[kSub];
  int widths[kSub];
  uint64_t masks[kSub];
  for (int sub = 0; sub < kSub; ++sub) {
    tables[sub] = books.tables[sub].data();
    widths[sub] = BitWidth(scheme, sub);
    masks[sub] = (uint64_t{1} << widths[sub]) - 1;
  }
  for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
    uint64_t code = codewords[v];
    for (int sub = 0; sub < kSub; ++sub) {
      std::memcpy(
          values + ptrdiff_t{v} * kVectorDim + ptrdiff_t{sub} * kColumns,
          tables[sub] + (code & masks[sub]) * kColumns,
          sizeof(float) * kColumns);
      code >>= widths[sub];
    }
  }
}

// Signed mode: row (code >> 8) of the table, value j negated when bit j of
// the code is set (the sign bit flipped, as the reference's negation).
HWY_INLINE void CopySignedRows(const Codebooks& books,
                               const uint64_t* HWY_RESTRICT codewords,
                               float* HWY_RESTRICT values) {
  const float* table = books.tables[0].data();
  for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
    const uint64_t code = codewords[v];
    uint32_t row[kVectorDim];
    std::memcpy(row, table + (code >> kVectorDim) * kVectorDim, sizeof(row));
    for (int j = 0; j < kVectorDim; ++j) {
      row[j] ^= static_cast<uint32_t>((code >> j) & 1u) << 31;
    }
    std::memcpy(values + ptrdiff_t{v} * kVectorDim, row, sizeof(row));
  }
}

// ExtractCodewords without copying the index bytes: each codeword is an
// 8-byte read of the block where those 8 bytes are index bytes, else (the
// last few) of a zero-padded copy of the last 8 index bytes.
HWY_INLINE void ReadCodewords(const uint8_t* HWY_RESTRICT block, int k,
                              uint64_t* HWY_RESTRICT codewords) {
  const int index_bytes = kCodewordsPerSuperblock * k / 8;  // >= 4
  const int tail_start = index_bytes > 8 ? index_bytes - 8 : 0;
  uint8_t tail[16] = {};
  std::memcpy(tail, block + tail_start,
              static_cast<size_t>(index_bytes - tail_start));
  const uint64_t mask = (uint64_t{1} << k) - 1;
  for (int v = 0; v < kCodewordsPerSuperblock; ++v) {
    const int first_bit = v * k;
    const int byte = first_bit >> 3;
    uint64_t window;  // little-endian hosts
    if (byte + 8 <= index_bytes) {
      std::memcpy(&window, block + byte, 8);
    } else {
      std::memcpy(&window, tail + (byte - tail_start), 8);
    }
    codewords[v] = (window >> (first_bit & 7)) & mask;
  }
}

void Decode(const Scheme& scheme, const Codebooks& books,
            const uint8_t* HWY_RESTRICT block, float row_scale,
            float* HWY_RESTRICT out) {
  uint64_t codewords[kCodewordsPerSuperblock];
  ReadCodewords(block, scheme.k, codewords);
  HWY_ALIGN float values[kSuperblock];
  if (scheme.mode == Mode::kSigned) {
    CopySignedRows(books, codewords, values);
  } else {
    HWY_DASSERT(scheme.n_sub == 1 || scheme.n_sub == 2 || scheme.n_sub == 4);
    switch (scheme.n_sub) {
      case 1:
        CopyProductRows<1>(scheme, books, codewords, values);
        break;
      case 2:
        CopyProductRows<2>(scheme, books, codewords, values);
        break;
      default:  // 4 (ValidateScheme)
        CopyProductRows<4>(scheme, books, codewords, values);
        break;
    }
  }
  // At most 16 lanes: a vector stays inside one scale group.
  const hn::CappedTag<float, kGroupSize> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t lanes = hn::Lanes(df);
  // bf16 of an fp32 vector (FloatToBf16): round to nearest even on the bits;
  // a NaN keeps its sign and upper payload, made quiet.
  const auto abs_mask = hn::Set(du, 0x7FFFFFFFu);
  const auto inf = hn::Set(du, 0x7F800000u);
  const auto quiet = hn::Set(du, 0x00400000u);
  const auto bias = hn::Set(du, 0x7FFFu);
  const auto one = hn::Set(du, 1u);
  const auto high = hn::Set(du, 0xFFFF0000u);
  const auto round_bf16 = [&](auto v) HWY_ATTR {
    const auto bits = hn::BitCast(du, v);
    const auto rounded =
        hn::Add(bits, hn::Add(bias, hn::And(hn::ShiftRight<16>(bits), one)));
    const auto nan = hn::Gt(hn::And(bits, abs_mask), inf);
    return hn::BitCast(
        df, hn::And(hn::IfThenElse(nan, hn::Or(bits, quiet), rounded), high));
  };
  if (scheme.grid == Grid::kFp8) {
    const auto scale = hn::Set(df, row_scale);
    for (size_t i = 0; i < static_cast<size_t>(kSuperblock); i += lanes) {
      hn::StoreU(round_bf16(hn::Mul(hn::Load(df, values + i), scale)), df,
                 out + i);
    }
    return;
  }
  float scales[kSuperblock / kGroupSize];
  DecodeGroupScales(scheme, block, scales);
  for (size_t i = 0; i < static_cast<size_t>(kSuperblock); i += lanes) {
    const auto scale = hn::Set(df, scales[i / kGroupSize]);
    hn::StoreU(round_bf16(hn::Mul(hn::Load(df, values + i), scale)), df,
               out + i);
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace mneme::formats::gridbook
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::formats::gridbook {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(Decode);

void DecodeSuperblockSimd(const Scheme& scheme, const Codebooks& books,
                          const uint8_t* block, float row_scale, float* out) {
  HWY_DYNAMIC_DISPATCH(Decode)(scheme, books, block, row_scale, out);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

}  // namespace mneme::formats::gridbook
#endif  // HWY_ONCE
