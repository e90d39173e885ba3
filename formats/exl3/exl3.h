#ifndef MNEME_FORMATS_EXL3_EXL3_H_
#define MNEME_FORMATS_EXL3_EXL3_H_

// The EXL3 weight format of exllamav3 (its GPU kernels are the definition:
// exllamav3_ext/quant/exl3_dq.cuh, codebook.cuh, pack.cu, reconstruct.cu;
// facts with sources in docs/FORMATS_EXL3_GRIDBOOK.md). One EXL3 Linear with
// k input and n output features (both multiples of 128) is
//
//   trellis  int16 [k/16, n/16, 16 * K]   one 16 x 16 tile per (tk, tn),
//                                         K = 1..8 bits per weight
//   suh      fp16 [k]                     input scales (sign x magnitude)
//   svh      fp16 [n]                     output scales
//
// and stands for W (k x n, y = x W) = diag(suh) H_k What H_n diag(svh), where
// H_m is block-diagonal with blocks H128 / sqrt(128) (H128 the natural-order
// Sylvester Hadamard matrix) and What holds one codebook value per 16-bit
// trellis state. The older checkpoints store packed signs `su` / `sv`
// (int16 [k/16] / [n/16]; bit i of word j set = element 16j + i is -1).
//
// A tile is a circular MSB-first bitstream of 256 K bits whose 32-bit words
// are the little-endian uint32 reads of the int16 pairs; position j's state is
// the 16 bits ending at bit (j + 1) K, and it sits at (r, c) = divmod(
// TilePermutation()[j], 16) of the tile (the tensor-core fragment order).
//
// Thread-safe; the tables are built once on first use.

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::formats::exl3 {

// The state -> value functions.
enum class Codebook {
  // 3INST: x * 89226354 + 64248484, then the MCG tail.
  k3Inst,
  // MCG: x * 0xCBAC1FED, then (x & 0x8FFF8FFF) ^ 0x3B603B60 read as two fp16
  // halves and summed (one rounding).
  kMcg,
  // MUL1: x * 0x83DCD12D, the sum s of its four bytes, fp16(
  // (1024 + s) * k_inv + k_bias) as one fused multiply-add.
  kMul1,
};

inline constexpr int kTileSide = 16;
inline constexpr int kTileValues = kTileSide * kTileSide;
inline constexpr int kMinBits = 1;
inline constexpr int kMaxBits = 8;
// The Hadamard block, and the multiple k and n must have.
inline constexpr int kHadamardSize = 128;

// "3inst", "mcg", "mul1".
const char* CodebookName(Codebook codebook);

// Codebook from the tensors an EXL3 Linear carries, as exllamav3 selects it:
// a `mcg` tensor selects MCG (also when `mul1` is present), else `mul1`
// selects MUL1, else 3INST.
Codebook SelectCodebook(bool has_mcg, bool has_mul1);

// fp16 bits of the codebook value of one 16-bit trellis state.
uint16_t CodebookValue(Codebook codebook, uint16_t state);

// All 65536 values of CodebookValue, as fp32 (exact), indexed by state.
const std::array<float, 65536>& CodebookTable(Codebook codebook);

// perm[j] = 16 r + c: where position j of a tile's stream lands in the tile.
const std::array<uint16_t, kTileValues>& TilePermutation();

// The 256 states of one tile of `bits` (1..8) bits per weight; `words` is
// the tile's 16 * bits int16 values as stored.
void DecodeTileStates(const uint16_t* words, int bits, uint16_t* states);

// One tile's values as fp32, row-major 16 x 16 (rows = input features,
// columns = output features), through `table` (CodebookTable()).
void DecodeTile(const uint16_t* words, int bits,
                const std::array<float, 65536>& table, float* tile);

// One tile's values in stream order: values[j] = the codebook value of state
// j (position j of DecodeTileStates; TilePermutation()[j] places it in the
// tile), through CodebookTable(). Scalar reference.
void DecodeTileStream(const uint16_t* words, int bits, Codebook codebook,
                      float* values);

// DecodeTileStream with Highway SIMD, dispatched to the best target this CPU
// supports: the state windows gathered from a rewritten stream, the codebook
// computed on the lanes (CodebookValuesSimd). The same values, bit for bit.
void DecodeTileStreamSimd(const uint16_t* words, int bits, Codebook codebook,
                          float* values);

// values[i] = CodebookTable(codebook)[states[i]] for i < count, computed on
// Highway vectors without the table: the codebook's integer hash, its fp16
// halves (MCG tail) or byte sum (MUL1) moved into fp32 exactly, and the
// fp16 rounding as round-to-nearest-even of the fp32 bits to 11 significant
// bits (exact here: the MCG sums are multiples of 2^-13 below 4, the MUL1
// values multiples of 2^-18 below 4, so no result needs a subnormal fp16
// rounding).
void CodebookValuesSimd(Codebook codebook, const uint16_t* states,
                        int64_t count, float* values);

// The Highway target the Simd functions dispatch to now, e.g. "AVX2".
const char* SimdTargetName();

// The in-place orthonormal Hadamard transform of 128 consecutive values
// (H128 / sqrt(128), natural order, symmetric: its own inverse).
void Hadamard128(float* values);

// Signs of the packed legacy form: `count` values (a multiple of 16) of +-1.
void UnpackSigns(const uint16_t* packed, int64_t count, float* signs);

// One EXL3 Linear as stored, borrowed (the pointers outlive the calls).
struct Exl3Weight {
  // Input features (k) and output features (n): multiples of 128.
  int64_t in_features = 0;
  int64_t out_features = 0;
  // Bits per weight, 1..8 (the trellis' last dimension / 16).
  int bits = 0;
  Codebook codebook = Codebook::kMul1;
  // [k/16, n/16, 16 * bits] int16.
  const uint16_t* trellis = nullptr;
  // fp16 scales: suh [k] and svh [n].
  const uint16_t* suh = nullptr;
  const uint16_t* svh = nullptr;
};

// Bytes of the trellis of a k x n weight at `bits` bits per weight.
inline int64_t TrellisBytes(int64_t in_features, int64_t out_features,
                            int bits) {
  return in_features * out_features * bits / 8;
}

// InvalidArgument when the shape or bit width is not one EXL3 stores
// (k, n positive multiples of 128, bits 1..8).
absl::Status ValidateExl3Shape(int64_t in_features, int64_t out_features,
                               int bits);

// ValidateExl3Shape, and InvalidArgument when a pointer is missing.
absl::Status ValidateExl3Weight(const Exl3Weight& weight);

// What (k x n, row-major, input features first) as fp32: the codebook values
// before the Hadamard transforms and scales (exact).
void DecodeTrellis(const Exl3Weight& weight, float* what);

// The weight in the model's orientation: out_features x in_features,
// row-major (W transposed), fp32. Rows [row_begin, row_end) of that matrix
// only (output features; both multiples of 128), written to
// out[(row - row_begin) * in_features + i]. The Hadamard products are
// evaluated in fp32 (the fp16 kernels agree to ~1e-3 relative).
void DequantizeOutputRows(const Exl3Weight& weight, int64_t row_begin,
                          int64_t row_end, float* out);

}  // namespace mneme::formats::exl3

#endif  // MNEME_FORMATS_EXL3_EXL3_H_
