#ifndef MNEME_FORMATS_GRIDBOOK_GRIDBOOK_H_
#define MNEME_FORMATS_GRIDBOOK_GRIDBOOK_H_

// The GridBook codebook weight formats (gridbook docs/SPEC.md is normative,
// tests/cb_torch_reference.py its reference; facts with sources in
// docs/FORMATS_EXL3_GRIDBOOK.md). A quantized [rows, in] weight (in a
// multiple of 256) stores each row as in / 256 superblocks of TypeSize()
// bytes:
//
//   4 k index bytes   32 codewords of k bits, LSB-first (stream bit 8 b + j
//                     is bit j of byte b; codeword v is stream bits
//                     [v k, v k + k)); codeword v covers weights 8 v .. 8 v + 7
//   scale plane       fp4 v1: 16 e4m3 group scales (group g = weights
//                     [16 g, 16 g + 16)); fp4 v2 (two-tier): one exponent
//                     byte E and 8 bytes of 4-bit table indices (group g in
//                     byte g / 2, even g in the low nibble), scale
//                     T[c] * 2^(E - 127); fp8: none (one fp32 scale per row,
//                     `weight_scale`)
//
// A codeword is decoded through fp16 tables of grid values (E2M1 values for
// fp4, finite E4M3 values for fp8): in product mode sub-index i takes
// BitWidth(i) bits, sub 0 in the low bits, and the 8 values are the
// concatenated rows sub_i[index_i] (8 / n_sub values each); in signed mode
// the low 8 bits are signs (bit j: value j negative) and the 8 magnitudes are
// row (code >> 8) of the single table. The decoded weight is
// bf16(f32(value) * f32(scale)), rounded to nearest even (the reference's
// decode contract v1).
//
// Thread-safe, no allocation in the decode functions.

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::formats::gridbook {

inline constexpr int kSuperblock = 256;
inline constexpr int kCodewordsPerSuperblock = 32;
inline constexpr int kVectorDim = 8;
inline constexpr int kGroupSize = 16;
inline constexpr int kMaxSubTables = 4;

enum class Grid { kFp4, kFp8 };
enum class Mode { kProduct, kSigned };
enum class ScaleCoding {
  // fp8 rungs: no scale plane, a per-row fp32 weight_scale.
  kNone,
  // fp4 v1: 16 e4m3 group scales per superblock.
  kE4m3,
  // fp4 v2: the two-tier plane (exponent byte + 4-bit table indices).
  kTwoTier,
};

// One quantization scheme (a config group's `scheme`).
struct Scheme {
  Grid grid = Grid::kFp4;
  Mode mode = Mode::kProduct;
  // Bits per codeword (per 8 weights). Product: n_sub..48; signed: 9..24.
  int k = 0;
  // Sub-tables: product fp4 2, product fp8 4, signed 1.
  int n_sub = 0;
  ScaleCoding scale_coding = ScaleCoding::kNone;
  // The two-tier table T (kTwoTier only). Default: T4_2oct8m.
  std::array<float, 16> two_tier_table = {};
  // The two-tier exponent bias. Default: 127.
  int super_bias = 127;
};

// T4_2oct8m: 1, 1.125, ..., 1.875, 2, 2.25, ..., 3.75.
std::array<float, 16> DefaultTwoTierTable();

// The scheme a format name stands for (NVFP4_CB_K<k>: fp4 product with two
// sub-tables; NVFP4_CB_S<k>: fp4 signed; FP8_CB_K<k>: fp8 product with four),
// with `scale_coding` for fp4 (kE4m3 or kTwoTier; ignored for fp8).
// InvalidArgument for another name or an unsupported k.
absl::StatusOr<Scheme> SchemeForFormat(absl::string_view format,
                                       ScaleCoding scale_coding);

// InvalidArgument naming the field when the scheme is not one this decoder
// serves (grid and scale coding mismatched, k or n_sub out of range).
absl::Status ValidateScheme(const Scheme& scheme);

// Bits of sub-index i in product mode: k / n_sub, plus one for the first
// k % n_sub sub-indices. In signed mode sub 0 has k - 8 bits.
int BitWidth(const Scheme& scheme, int sub);

// Rows of sub-table i (2^BitWidth) and values per row (8 / n_sub).
int64_t SubTableRows(const Scheme& scheme, int sub);
int SubTableColumns(const Scheme& scheme);

// Bytes per superblock: 4 k, plus 16 (fp4 v1) or 9 (fp4 v2).
int TypeSize(const Scheme& scheme);

// The scheme's tables as fp32 (from the sidecar's fp16), sub 0 first; each
// [SubTableRows(i), SubTableColumns()] row-major.
struct Codebooks {
  std::array<std::vector<float>, kMaxSubTables> tables;
};

// InvalidArgument naming the table when a size does not match the scheme;
// DataLoss when a value is not finite.
absl::Status ValidateCodebooks(const Scheme& scheme, const Codebooks& books);

// The 32 codewords of a superblock's index bytes.
void ExtractCodewords(const uint8_t* block, int k, uint64_t* codewords);

// The 16 group scales of an fp4 superblock (`block` points at the
// superblock; its scale plane follows the index bytes). Not for fp8.
void DecodeGroupScales(const Scheme& scheme, const uint8_t* block,
                       float* scales);

// One superblock's 256 values as fp32 (each exactly a bf16 value):
// `row_scale` is the row's weight_scale (fp8) and is ignored for fp4.
void DecodeSuperblock(const Scheme& scheme, const Codebooks& books,
                      const uint8_t* block, float row_scale, float* out);

// DecodeSuperblock with Highway SIMD, dispatched to the best target this CPU
// supports: the same values, bit for bit.
void DecodeSuperblockSimd(const Scheme& scheme, const Codebooks& books,
                          const uint8_t* block, float row_scale, float* out);

// The Highway target DecodeSuperblockSimd dispatches to now, e.g. "AVX2".
const char* SimdTargetName();

// A whole row of `in_features` (a multiple of 256) as bf16 bits.
void DecodeRowBf16(const Scheme& scheme, const Codebooks& books,
                   const uint8_t* row, int64_t in_features, float row_scale,
                   uint16_t* out);

// The NVFP4 rungs' static W4A4 activation contract
// (e2m1_group16_ue4m3_static; gridbook codec.py nvfp4_act_quant_ref): with
// G the target's input_global_scale, each group of 16 values is scaled
// xs = x * G (fp32), its scale is sf = e4m3(min(amax(|xs|) / 6, 448))
// (rounded to nearest even), each value q = e2m1(clamp(xs / sf, -6, 6))
// (ties to the even code; a group with sf = 0 is zero, signs kept), and the
// product uses (e2m1(q) * e4m3(sf)) * fp32(1 / G) in place of x. `count` is
// a multiple of 16; `codes` (count e2m1 codes) and `scales` (count / 16 e4m3
// codes) may be null.
void QuantizeActivationsW4A4(const float* x, int64_t count, float global_scale,
                             float* xq, uint8_t* codes, uint8_t* scales);

}  // namespace mneme::formats::gridbook

#endif  // MNEME_FORMATS_GRIDBOOK_GRIDBOOK_H_
