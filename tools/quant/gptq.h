#ifndef MNEME_TOOLS_QUANT_GPTQ_H_
#define MNEME_TOOLS_QUANT_GPTQ_H_

// GPTQ error feedback for Engram rows (QUANT.md section 1). The error a row
// of hash column c sends into the model is ||W_c e||, with W_c the column's
// 256-input slice of wkv, so its Hessian is H = W_c^T W_c. A row's 256
// values are quantized in order; each value's rounding error, divided by the
// factor's diagonal, is fed forward into the values not yet quantized through
// the upper Cholesky factor U of (H + damp I)^-1 (damp = 0.01 x mean(diag H)),
// as GPTQ does for the rows of a weight matrix. No calibration data is
// involved: H comes from wkv alone.
//
// The feedback is applied lazily in batches of columns: inside a batch value
// by value, past it with one matrix product per batch (BLAS), which is what
// makes it fast. A block's e4m3 scale is chosen (amax or MSE, nvfp4_quant.h)
// when the block's first value is reached, from the block's error-fed
// values.
//
// Linear algebra: OpenBLAS throughout. H's Cholesky factorization and
// inverse are LAPACK dpotrf / dpotri in double precision on the 256 x 256
// matrix (about a millisecond per hash column; a plain loop version was
// 20-40x slower, its dependent additions do not vectorize); the products
// are sgemm.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/row_format.h"
#include "tools/quant/nvfp4_quant.h"

namespace mneme::quant {

// GPTQ's damping: this fraction of mean(diag H) is added to H's diagonal.
inline constexpr double kDefaultDampFraction = 0.01;

// What one hash column contributes to GPTQ and to error measurement. Plain
// data; immutable after MakeColumnFactor().
struct ColumnFactor {
  // H = W_c^T W_c (undamped), kRowDim x kRowDim, row-major, symmetric, fp32:
  // ||W_c e||^2 = e^T H e.
  std::vector<float> hessian;
  // U, upper triangular with (H + damp I)^-1 = U^T U, row-major, fp32 (the
  // lower triangle is zero).
  std::vector<float> upper;
  // The damp added to H's diagonal.
  double damp = 0.0;
};

// Builds the factor of a hash column from H (kRowDim x kRowDim doubles,
// row-major; only the upper triangle is read). An all-zero H (no
// information) gets damp 1, so U = I and GPTQ reduces to RTN.
// InvalidArgument for a wrong size, a negative damp_fraction, or an H that
// is not positive semidefinite (NaN, negative diagonal) so that the damped
// matrix has no Cholesky factor.
absl::StatusOr<ColumnFactor> MakeColumnFactor(
    absl::Span<const double> hessian,
    double damp_fraction = kDefaultDampFraction);

// Rows quantized per GptqQuantizeChunk() call.
inline constexpr int kGptqChunkRows = 64;

struct GptqOptions {
  // The table's global scale; finite and > 0. Required.
  float global_scale = 0.0f;
  // Block scale choice. Default: kMse.
  ScaleChoice scale = ScaleChoice::kMse;
  // Columns per lazy batch: a multiple of 16 that divides 256. Default: 32.
  int batch_columns = 32;
};

// Quantizes kGptqChunkRows rows of one hash column. `work` holds them
// column-major, work[i * kGptqChunkRows + r] being value i of row r, and is
// overwritten with the error-fed values. codes[r * kRowDim + i] receives the
// e2m1 code of value i of row r (unpacked), scales[r * 16 + b] the e4m3
// scale of its block b. Adds to *stats when non-null (smaller_scale_blocks
// counts MSE choices below the amax scale of the error-fed block).
// Thread-safe for distinct buffers; `options` must be valid (checked only
// by debug assertions).
void GptqQuantizeChunk(const ColumnFactor& factor, const GptqOptions& options,
                       float* work, uint8_t* codes, uint8_t* scales,
                       RowQuantStats* stats = nullptr);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_GPTQ_H_
