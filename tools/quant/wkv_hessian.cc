#include "tools/quant/wkv_hessian.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_header.h"
#include "common/status_macros.h"
#include "formats/block_formats.h"
#include "formats/row_format.h"
#include "tools/quant/blas.h"
#include "tools/quant/parallel.h"

namespace mneme::quant {
namespace {

using checkpoint::DType;
using checkpoint::DTypeName;

constexpr int64_t kWkvBlock = 32;
// Rows dequantized per band (a multiple of kWkvBlock).
constexpr int64_t kBandRows = 256;

std::string Describe(const std::string& name) {
  return absl::StrCat("tensor ", checkpoint::QuoteTensorName(name));
}

}  // namespace

std::string WkvWeightTensorName(int layer) {
  return absl::StrCat("layers.", layer, ".engram.wkv.weight");
}

std::string WkvScaleTensorName(int layer) {
  return absl::StrCat("layers.", layer, ".engram.wkv.scale");
}

absl::StatusOr<WkvTensors> LocateWkv(const checkpoint::TensorSource& source,
                                     int layer, int num_columns) {
  WkvTensors wkv;
  wkv.layer = layer;
  wkv.source = &source;
  wkv.weight_name = WkvWeightTensorName(layer);
  wkv.scale_name = WkvScaleTensorName(layer);
  ASSIGN_OR_RETURN(const checkpoint::TensorSpec weight,
                   source.GetTensorSpec(wkv.weight_name));
  ASSIGN_OR_RETURN(const checkpoint::TensorSpec scale,
                   source.GetTensorSpec(wkv.scale_name));
  if (weight.dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(wkv.weight_name), ": is ", DTypeName(weight.dtype),
        "; the quantizer reads wkv only as F8_E4M3 with F8_E8M0 32x32 scales"));
  }
  if (scale.dtype != DType::kF8E8M0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(wkv.scale_name), ": is ", DTypeName(scale.dtype),
                     ", expected F8_E8M0 (one scale per 32x32 block)"));
  }
  const std::vector<int64_t>& ws = weight.shape;
  const int64_t in_dim = int64_t{num_columns} * formats::kRowDim;
  if (ws.size() != 2 || ws[0] < 1 || ws[1] != in_dim) {
    return absl::DataLossError(absl::StrCat(
        Describe(wkv.weight_name), ": shape [", absl::StrJoin(ws, ", "),
        "] does not match ", num_columns, " hash columns of 256 (expected [",
        "out, ", in_dim, "])"));
  }
  wkv.out_dim = ws[0];
  wkv.in_dim = in_dim;
  const std::vector<int64_t> want_scale = {
      (wkv.out_dim + kWkvBlock - 1) / kWkvBlock, in_dim / kWkvBlock};
  if (scale.shape != want_scale) {
    return absl::DataLossError(absl::StrCat(
        Describe(wkv.scale_name), ": shape [", absl::StrJoin(scale.shape, ", "),
        "] does not match wkv.weight [", wkv.out_dim, ", ", in_dim,
        "] in 32x32 blocks (expected [", absl::StrJoin(want_scale, ", "),
        "])"));
  }
  return wkv;
}

absl::StatusOr<std::vector<std::vector<double>>> ComputeWkvHessians(
    const WkvTensors& wkv, int threads) {
  EnsureSingleThreadedBlas();
  constexpr int kN = formats::kRowDim;
  const int columns = static_cast<int>(wkv.in_dim / kN);
  const int64_t scale_cols = wkv.in_dim / kWkvBlock;
  std::vector<std::vector<double>> hessians(
      columns, std::vector<double>(static_cast<size_t>(kN) * kN, 0.0));
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
  std::vector<float> band_f32;
  std::vector<double> band;
  for (int64_t first = 0; first < wkv.out_dim; first += kBandRows) {
    const int64_t band_height = std::min(kBandRows, wkv.out_dim - first);
    const int64_t scale_rows = (band_height + kWkvBlock - 1) / kWkvBlock;
    codes.resize(band_height * wkv.in_dim);
    scales.resize(scale_rows * scale_cols);
    RETURN_IF_ERROR(wkv.source->ReadTensorByteRange(
        wkv.weight_name, first * wkv.in_dim, absl::MakeSpan(codes)));
    RETURN_IF_ERROR(wkv.source->ReadTensorByteRange(
        wkv.scale_name, (first / kWkvBlock) * scale_cols,
        absl::MakeSpan(scales)));
    // The first NaN element in row-major order: a NaN code, or the first
    // element of the first block with a NaN scale.
    int64_t nan = formats::FindE4m3Nan(codes.data(), band_height * wkv.in_dim);
    if (const int64_t s =
            formats::FindUe8m0Nan(scales.data(), scale_rows * scale_cols);
        s >= 0) {
      const int64_t first_element = (s / scale_cols) * kWkvBlock * wkv.in_dim +
                                    (s % scale_cols) * kWkvBlock;
      if (nan < 0 || first_element < nan) nan = first_element;
    }
    if (nan >= 0) {
      return absl::DataLossError(absl::StrCat(
          Describe(wkv.weight_name), ": NaN at row ", first + nan / wkv.in_dim,
          ", column ", nan % wkv.in_dim));
    }
    band_f32.resize(band_height * wkv.in_dim);
    formats::DequantizeFp8BlockRows(codes.data(), scales.data(), wkv.in_dim,
                                    kWkvBlock, kWkvBlock, 0, band_height,
                                    band_f32.data());
    band.assign(band_f32.begin(), band_f32.end());
    absl::Status status = ParallelFor(threads, columns, [&](int64_t c) {
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, kN,
                  static_cast<int>(band_height), 1.0, band.data() + c * kN,
                  static_cast<int>(wkv.in_dim), 1.0, hessians[c].data(), kN);
      return absl::OkStatus();
    });
    if (!status.ok()) return status;
  }
  for (std::vector<double>& h : hessians) {
    for (int i = 0; i < kN; ++i) {
      for (int j = 0; j < i; ++j) h[i * kN + j] = h[j * kN + i];
    }
  }
  return hessians;
}

}  // namespace mneme::quant
