#include "tools/quant/gptq.h"

#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "formats/e4m3.h"
#include "tools/quant/blas.h"

// LAPACK from OpenBLAS (Debian's libopenblas provides the symbols; no
// header ships with it). Column-major; the trailing argument is the hidden
// length of the character argument that gfortran-built LAPACKs expect.
extern "C" {
void dpotrf_(const char* uplo, const blasint* n, double* a, const blasint* lda,
             blasint* info, size_t uplo_length);
void dpotri_(const char* uplo, const blasint* n, double* a, const blasint* lda,
             blasint* info, size_t uplo_length);
}

namespace mneme::quant {
namespace {

constexpr int kN = formats::kRowDim;
constexpr int kBlocksPerRow = kN / kBlock;

}  // namespace

absl::StatusOr<ColumnFactor> MakeColumnFactor(absl::Span<const double> hessian,
                                              double damp_fraction) {
  if (hessian.size() != static_cast<size_t>(kN) * kN) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Hessian holds ", hessian.size(), " values, expected ", kN * kN));
  }
  if (!(damp_fraction >= 0.0) || !std::isfinite(damp_fraction)) {
    return absl::InvalidArgumentError(
        absl::StrCat("damp_fraction must be >= 0, got ", damp_fraction));
  }
  ColumnFactor factor;
  factor.hessian.resize(static_cast<size_t>(kN) * kN);
  double mean_diag = 0.0;
  for (int i = 0; i < kN; ++i) {
    mean_diag += hessian[i * kN + i];
    for (int j = i; j < kN; ++j) {
      const float v = static_cast<float>(hessian[i * kN + j]);
      factor.hessian[i * kN + j] = v;
      factor.hessian[j * kN + i] = v;
    }
  }
  mean_diag /= kN;
  factor.damp = mean_diag == 0.0 ? 1.0 : damp_fraction * mean_diag;
  for (double v : hessian) {
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          "the Hessian of the wkv slice holds NaN or infinite values");
    }
  }

  // Column-major upper triangle (i <= j at a[i + j n]) of H + damp I: the
  // row-major upper triangle of the symmetric H, read transposed.
  std::vector<double> a(static_cast<size_t>(kN) * kN, 0.0);
  for (int j = 0; j < kN; ++j) {
    for (int i = 0; i <= j; ++i) a[i + j * kN] = hessian[i * kN + j];
    a[j + j * kN] += factor.damp;
  }
  const blasint n = kN;
  blasint info = 0;
  // H + damp I = R^T R, then its inverse from R, then Hinv = U^T U.
  dpotrf_("U", &n, a.data(), &n, &info, 1);
  if (info == 0) dpotri_("U", &n, a.data(), &n, &info, 1);
  if (info == 0) dpotrf_("U", &n, a.data(), &n, &info, 1);
  if (info != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the damped Hessian of the wkv slice or its inverse is not positive "
        "definite (LAPACK info ",
        info, ")"));
  }
  factor.upper.assign(static_cast<size_t>(kN) * kN, 0.0f);
  for (int i = 0; i < kN; ++i) {
    for (int j = i; j < kN; ++j) {
      factor.upper[i * kN + j] = static_cast<float>(a[i + j * kN]);
    }
  }
  return factor;
}

void GptqQuantizeChunk(const ColumnFactor& factor, const GptqOptions& options,
                       float* work, uint8_t* codes, uint8_t* scales,
                       RowQuantStats* stats) {
  constexpr int R = kGptqChunkRows;
  const int batch = options.batch_columns;
  assert(batch > 0 && batch % kBlock == 0 && kN % batch == 0);
  assert(options.global_scale > 0.0f);
  EnsureSingleThreadedBlas();
  const float gs = options.global_scale;
  const float* u = factor.upper.data();
  // Scaled errors of the current batch, batch x R, row-major.
  std::vector<float> errors(static_cast<size_t>(batch) * R);
  uint8_t block_scale[R];
  float step[R];
  float block_values[kBlock];
  for (int b0 = 0; b0 < kN; b0 += batch) {
    const int b1 = b0 + batch;
    for (int i = b0; i < b1; ++i) {
      if (i % kBlock == 0) {
        for (int r = 0; r < R; ++r) {
          for (int k = 0; k < kBlock; ++k) {
            block_values[k] = work[(i + k) * R + r];
          }
          bool smaller = false;
          block_scale[r] =
              ChooseBlockScale(block_values, gs, options.scale, &smaller);
          if (stats != nullptr && smaller) ++stats->smaller_scale_blocks;
          scales[r * kBlocksPerRow + i / kBlock] = block_scale[r];
          step[r] = formats::E4m3ToFloat(block_scale[r]) * gs;
        }
      }
      const float d = u[i * kN + i];
      float* __restrict e = errors.data() + int64_t{i - b0} * R;
      const float* __restrict x = work + int64_t{i} * R;
      for (int r = 0; r < R; ++r) {
        const uint8_t code = Nvfp4Code(x[r], step[r]);
        codes[r * kN + i] = code;
        e[r] = (x[r] - Nvfp4Value(code, block_scale[r], gs)) / d;
      }
      // Feed the error into the rest of the batch right away.
      for (int j = i + 1; j < b1; ++j) {
        const float uij = u[i * kN + j];
        float* __restrict xj = work + int64_t{j} * R;
        for (int r = 0; r < R; ++r) xj[r] -= uij * e[r];
      }
    }
    // ...and into the columns past the batch with one product:
    // work[b1:, :] -= U[b0:b1, b1:]^T errors.
    if (b1 < kN) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kN - b1, R, batch,
                  -1.0f, u + int64_t{b0} * kN + b1, kN, errors.data(), R, 1.0f,
                  work + int64_t{b1} * R, R);
    }
  }
}

}  // namespace mneme::quant
