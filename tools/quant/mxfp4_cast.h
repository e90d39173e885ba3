#ifndef MNEME_TOOLS_QUANT_MXFP4_CAST_H_
#define MNEME_TOOLS_QUANT_MXFP4_CAST_H_

// The closed-form MXFP4 -> NVFP4 cast of one tensor (QUANT.md section 2).
//
// MXFP4: e2m1 nibbles, one UE8M0 scale 2^k per 32 values (value = e2m1 x
// 2^k; code 0 is 2^-127 as in ue8m0.h). NVFP4: the same nibbles, one e4m3
// scale per 16 values and one fp32 weight_scale_2 per tensor (value =
// (e2m1 x e4m3) x weight_scale_2, the decoders' order). With
// weight_scale_2 = 2^(k_max - 8), k_max the largest block exponent, block
// k gets the e4m3 scale 2^p, p = k - k_max + 8 <= 8, on both its 16-value
// halves, and every nibble is kept. 2^p is an e4m3 value for p in [-9, 8]
// (2^-9 .. 2^-7 are subnormals): those blocks are castable and decode to
// exactly the source values. A block with p < -9 is not: it gets the
// smallest scale 2^-9 and its nibbles re-rounded to that step.
//
// All functions are pure and thread-safe.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/block_pack/fp4_pack.h"

namespace mneme::quant {

// Values per MXFP4 source block.
inline constexpr int kMxfp4Block = 32;

// Exponent of weight_scale_2 for a largest block exponent k_max.
inline int WeightScale2Exponent(int k_max) { return k_max - 8; }

// The e4m3 code of 2^p: p in [-9, 8]; nullopt outside (fp4_pack.h).
using formats::E4m3PowerOfTwo;

// Largest block exponent (code - 127) of UE8M0 `scales`; InvalidArgument
// if empty, DataLoss for a NaN code (255) naming its index.
absl::StatusOr<int> MaxBlockExponent(absl::Span<const uint8_t> scales);

// A source block that did not decode to the same values.
struct LossyBlock {
  int64_t row = 0;
  // Block index within the row (32 values each).
  int64_t block = 0;
  // Its exponent k and the e4m3 power p it would have needed.
  int exponent = 0;
  int power = 0;
  // Largest |nvfp4 - mxfp4| in the block.
  double max_abs_error = 0.0;
};

// Counters of a cast; Add() sums.
struct CastStats {
  // Source blocks (32 values each).
  int64_t blocks = 0;
  // Blocks whose 2^p is an e4m3 value (nibbles kept verbatim).
  int64_t castable_blocks = 0;
  // Blocks whose 32 values decode identically (every castable block; an
  // uncastable one only by chance, e.g. all zero).
  int64_t lossless_blocks = 0;
  // Largest |nvfp4 - mxfp4| over all values.
  double max_abs_error = 0.0;

  void Add(const CastStats& other);
};

// Casts an MXFP4 tensor of `rows` x `cols` values (cols a positive multiple
// of 32): `packed` rows x cols/2 bytes (two nibbles per byte; each byte's
// two values share a block), `scales` rows x cols/32 UE8M0 codes. Writes
// `out_packed` (rows x cols/2) and `out_scales` (rows x cols/16 e4m3 codes)
// for weight_scale_2 = 2^ws2_exponent, adds to *stats, and appends lossy
// blocks to *lossy (when non-null) while it holds fewer than `max_lossy`.
// InvalidArgument for inconsistent sizes, a ws2_exponent outside
// [-149, 127], or a block exponent above ws2_exponent + 8 (the caller's
// k_max was wrong); DataLoss for a NaN scale (naming row and block).
absl::Status CastMxfp4Tensor(int64_t rows, int64_t cols,
                             absl::Span<const uint8_t> packed,
                             absl::Span<const uint8_t> scales, int ws2_exponent,
                             absl::Span<uint8_t> out_packed,
                             absl::Span<uint8_t> out_scales, CastStats* stats,
                             std::vector<LossyBlock>* lossy = nullptr,
                             size_t max_lossy = 0);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_MXFP4_CAST_H_
