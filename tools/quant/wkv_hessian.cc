#include "tools/quant/wkv_hessian.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/dtype.h"
#include "formats/e4m3.h"
#include "formats/row_format.h"
#include "formats/ue8m0.h"
#include "tools/quant/blas.h"
#include "tools/quant/parallel.h"

namespace mneme::quant {
namespace {

using checkpoint::DType;
using checkpoint::DTypeName;

constexpr int64_t kWkvBlock = 32;
// Rows dequantized per band (a multiple of kWkvBlock).
constexpr int64_t kBandRows = 256;

std::string Describe(const checkpoint::TensorLocation& t) {
  return absl::StrCat("safetensors file '", t.shard->path(), "', tensor ",
                      checkpoint::QuoteTensorName(t.info->name));
}

}  // namespace

std::string WkvWeightTensorName(int layer) {
  return absl::StrCat("layers.", layer, ".engram.wkv.weight");
}

std::string WkvScaleTensorName(int layer) {
  return absl::StrCat("layers.", layer, ".engram.wkv.scale");
}

absl::StatusOr<WkvTensors> LocateWkv(
    const checkpoint::ShardedCheckpoint& checkpoint, int layer,
    int num_columns) {
  WkvTensors wkv;
  wkv.layer = layer;
  absl::StatusOr<checkpoint::TensorLocation> weight =
      checkpoint.Find(WkvWeightTensorName(layer));
  if (!weight.ok()) return weight.status();
  absl::StatusOr<checkpoint::TensorLocation> scale =
      checkpoint.Find(WkvScaleTensorName(layer));
  if (!scale.ok()) return scale.status();
  wkv.weight = *weight;
  wkv.scale = *scale;
  if (weight->info->dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(*weight), ": is ", DTypeName(weight->info->dtype),
        "; the quantizer reads wkv only as F8_E4M3 with F8_E8M0 32x32 scales"));
  }
  if (scale->info->dtype != DType::kF8E8M0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(*scale), ": is ", DTypeName(scale->info->dtype),
                     ", expected F8_E8M0 (one scale per 32x32 block)"));
  }
  const std::vector<int64_t>& ws = weight->info->shape;
  const int64_t in_dim = int64_t{num_columns} * formats::kRowDim;
  if (ws.size() != 2 || ws[0] < 1 || ws[1] != in_dim) {
    return absl::DataLossError(absl::StrCat(
        Describe(*weight), ": shape [", absl::StrJoin(ws, ", "),
        "] does not match ", num_columns, " hash columns of 256 (expected [",
        "out, ", in_dim, "])"));
  }
  wkv.out_dim = ws[0];
  wkv.in_dim = in_dim;
  const std::vector<int64_t> want_scale = {
      (wkv.out_dim + kWkvBlock - 1) / kWkvBlock, in_dim / kWkvBlock};
  if (scale->info->shape != want_scale) {
    return absl::DataLossError(absl::StrCat(
        Describe(*scale), ": shape [", absl::StrJoin(scale->info->shape, ", "),
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
  std::vector<double> band;
  for (int64_t first = 0; first < wkv.out_dim; first += kBandRows) {
    const int64_t rows = std::min(kBandRows, wkv.out_dim - first);
    const int64_t scale_rows = (rows + kWkvBlock - 1) / kWkvBlock;
    codes.resize(rows * wkv.in_dim);
    scales.resize(scale_rows * scale_cols);
    if (absl::Status s = wkv.weight.shard->ReadTensorRange(
            wkv.weight.info->name, first * wkv.in_dim, absl::MakeSpan(codes));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = wkv.scale.shard->ReadTensorRange(
            wkv.scale.info->name, (first / kWkvBlock) * scale_cols,
            absl::MakeSpan(scales));
        !s.ok()) {
      return s;
    }
    band.resize(rows * wkv.in_dim);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* scale_row = scales.data() + (r / kWkvBlock) * scale_cols;
      for (int64_t c = 0; c < wkv.in_dim; ++c) {
        const uint8_t code = codes[r * wkv.in_dim + c];
        const uint8_t e = scale_row[c / kWkvBlock];
        if ((code & 0x7F) == 0x7F || e == 255) {
          return absl::DataLossError(absl::StrCat(Describe(wkv.weight),
                                                  ": NaN at row ", first + r,
                                                  ", column ", c));
        }
        band[r * wkv.in_dim + c] =
            static_cast<double>(formats::E4m3ToFloat(code)) *
            formats::Ue8m0ToFloat(e);
      }
    }
    absl::Status status = ParallelFor(threads, columns, [&](int64_t c) {
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, kN,
                  static_cast<int>(rows), 1.0, band.data() + c * kN,
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
