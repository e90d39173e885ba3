#ifndef MNEME_TOOLS_QUANT_WKV_HESSIAN_H_
#define MNEME_TOOLS_QUANT_WKV_HESSIAN_H_

// The Engram wkv projection of a layer as the quantizer sees it: per hash
// column c, the Hessian H_c = W_c^T W_c of the 256-input slice W_c =
// wkv[:, 256c : 256c + 256] (ENGRAM.md; wkv is FP8 e4m3 [out, 256 x
// columns] with one UE8M0 scale per 32 x 32 block).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/tensor_source.h"

namespace mneme::quant {

// "layers.<layer>.engram.wkv.weight" / ".scale".
std::string WkvWeightTensorName(int layer);
std::string WkvScaleTensorName(int layer);

// A layer's wkv tensors, checked.
struct WkvTensors {
  int layer = 0;
  // Where they are read from; not owned (outlives this struct).
  const checkpoint::TensorSource* source = nullptr;
  std::string weight_name;
  std::string scale_name;
  // wkv.weight is [out_dim, in_dim]; in_dim = 256 x columns.
  int64_t out_dim = 0;
  int64_t in_dim = 0;
};

// Finds and checks layer `layer`'s wkv for `num_columns` hash columns.
// NotFound naming the tensor if either is absent; InvalidArgument if
// wkv.weight is not F8_E4M3 or wkv.scale not F8_E8M0 (the only layout
// supported); DataLoss (naming tensor and shapes) if wkv.weight is not
// [out, 256 x num_columns] with out >= 1 or wkv.scale is not
// [ceil(out / 32), 8 x num_columns].
absl::StatusOr<WkvTensors> LocateWkv(const checkpoint::TensorSource& source,
                                     int layer, int num_columns);

// Dequantizes wkv (fp32 values e4m3 x 2^(e - 127)) in bands of rows and
// accumulates every column's H_c = W_c^T W_c in double precision (BLAS
// dsyrk, columns spread over `threads` threads, 0 = all cores). Returns
// in_dim / 256 matrices of 256 x 256 doubles, row-major, symmetric.
// DataLoss for a NaN code or scale (naming the tensor and the row) or a
// file that became shorter.
absl::StatusOr<std::vector<std::vector<double>>> ComputeWkvHessians(
    const WkvTensors& wkv, int threads);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_WKV_HESSIAN_H_
