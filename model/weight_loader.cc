#include "model/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "gpu/host_weight.h"

namespace mneme::model {
namespace {

using checkpoint::DType;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [r0, r0 + rn) and bytes [b0, b0 + bn) of each row of a row-major
// matrix whose rows are row_bytes long.
std::vector<uint8_t> SliceBytes(const std::vector<uint8_t>& src,
                                int64_t row_bytes, int64_t r0, int64_t rn,
                                int64_t b0, int64_t bn) {
  std::vector<uint8_t> out(static_cast<size_t>(rn * bn));
  for (int64_t r = 0; r < rn; ++r) {
    std::memcpy(out.data() + r * bn, src.data() + (r0 + r) * row_bytes + b0,
                static_cast<size_t>(bn));
  }
  return out;
}

// Whether [begin, begin + count) of an axis of `size` falls on blocks.
bool Aligned(int64_t begin, int64_t count, int64_t size, int64_t block) {
  return begin % block == 0 && (count % block == 0 || begin + count == size);
}

}  // namespace

std::string WeightLoader::Where() const {
  return source_name_.empty() ? "" : absl::StrCat(source_name_, ": ");
}

absl::StatusOr<std::vector<uint8_t>> WeightLoader::Read(
    absl::string_view name, const std::vector<DType>& dtypes,
    const std::vector<int64_t>& shape, checkpoint::TensorSpec* spec) {
  ASSIGN_OR_RETURN(checkpoint::TensorSpec t, source_.GetTensorSpec(name));
  bool dtype_ok = false;
  std::vector<std::string> names;
  for (DType d : dtypes) {
    dtype_ok |= t.dtype == d;
    names.push_back(std::string(checkpoint::DTypeName(d)));
  }
  if (!dtype_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "tensor ", name, " has dtype ", checkpoint::DTypeName(t.dtype),
        ", expected ", absl::StrJoin(names, " or ")));
  }
  // A scalar may be stored as [] or [1].
  const bool scalar_ok =
      shape.empty() && t.shape.size() == 1 && t.shape[0] == 1;
  if (t.shape != shape && !scalar_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "tensor ", name, " has shape ", ShapeString(t.shape),
        ", the config implies ", ShapeString(shape)));
  }
  if (spec != nullptr) *spec = t;
  if (headers_only_) return std::vector<uint8_t>();
  return source_.ReadTensorBytes(name);
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::Linear(
    absl::string_view name, int64_t rows, int64_t cols, Slice row_slice,
    Slice col_slice) {
  const std::string wname = absl::StrCat(name, ".weight");
  ASSIGN_OR_RETURN(const checkpoint::TensorSpec spec,
                   source_.GetTensorSpec(wname));
  const DType dtype = spec.dtype;

  gpu::HostWeight w;
  w.rows = rows;
  w.cols = cols;
  std::vector<uint8_t> data, scale;
  int64_t scale_block_cols = 0;  // Columns per scale byte (fp4 formats).
  if (dtype == DType::kF32 || dtype == DType::kBf16) {
    w.format = dtype == DType::kF32 ? gpu::WeightFormat::kF32
                                    : gpu::WeightFormat::kBf16;
    ASSIGN_OR_RETURN(data, Read(wname, {dtype}, {rows, cols}, nullptr));
  } else if (dtype == DType::kF8E4M3) {
    w.format = gpu::WeightFormat::kFp8Block;
    w.block_rows = fp8_block_rows_;
    w.block_cols = fp8_block_cols_;
    ASSIGN_OR_RETURN(data, Read(wname, {dtype}, {rows, cols}, nullptr));
    checkpoint::TensorSpec scale_spec;
    const int64_t scale_rows = CeilDiv(rows, fp8_block_rows_);
    const int64_t scale_cols = CeilDiv(cols, fp8_block_cols_);
    ASSIGN_OR_RETURN(
        scale, Read(absl::StrCat(name, ".scale"), {DType::kF8E8M0, DType::kF32},
                    {scale_rows, scale_cols}, &scale_spec));
    if (scale_spec.dtype == DType::kF32 && !headers_only_) {
      // FP8 with float32 block scales (the V4-Flash Base release's
      // experts): dequantized here, exactly, into an fp32 weight.
      std::vector<uint8_t> values(static_cast<size_t>(rows * cols * 4));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          float s;
          std::memcpy(&s,
                      scale.data() + ((r / fp8_block_rows_) * scale_cols +
                                      c / fp8_block_cols_) *
                                         4,
                      4);
          if (!std::isfinite(s)) {
            return absl::DataLossError(absl::StrCat(
                Where(), "tensor ", name, ".scale has a non-finite value"));
          }
          const float v = static_cast<float>(
              double{formats::E4m3ToFloat(data[r * cols + c])} * s);
          std::memcpy(values.data() + (r * cols + c) * 4, &v, 4);
        }
      }
      data = std::move(values);
      scale.clear();
      w.format = gpu::WeightFormat::kF32;
    }
  } else if (dtype == DType::kU8 || dtype == DType::kI8) {
    const std::string nv_scale = absl::StrCat(name, ".weight_scale");
    const bool nvfp4 = Has(nv_scale);
    w.format = nvfp4 ? gpu::WeightFormat::kNvfp4 : gpu::WeightFormat::kMxfp4;
    scale_block_cols = nvfp4 ? 16 : 32;
    if (cols % scale_block_cols != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), "fp4 tensor ", wname, " has ", cols,
                       " input columns, not a multiple of ", scale_block_cols));
    }
    ASSIGN_OR_RETURN(
        data, Read(wname, {DType::kU8, DType::kI8}, {rows, cols / 2}, nullptr));
    if (nvfp4) {
      ASSIGN_OR_RETURN(
          scale, Read(nv_scale, {DType::kF8E4M3}, {rows, cols / 16}, nullptr));
      ASSIGN_OR_RETURN(const std::vector<float> g,
                       Floats(absl::StrCat(name, ".weight_scale_2"), {}));
      w.global_scale = g[0];
    } else {
      ASSIGN_OR_RETURN(scale,
                       Read(absl::StrCat(name, ".scale"), {DType::kF8E8M0},
                            {rows, cols / 32}, nullptr));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "tensor ", wname, " has dtype ", checkpoint::DTypeName(dtype),
        ", expected F32, BF16, F8_E4M3 (FP8) or U8 (fp4)"));
  }

  // Resolve and check the slices.
  if (row_slice.count < 0) row_slice.count = rows - row_slice.begin;
  if (col_slice.count < 0) col_slice.count = cols - col_slice.begin;
  if (row_slice.begin < 0 || row_slice.count <= 0 ||
      row_slice.begin + row_slice.count > rows || col_slice.begin < 0 ||
      col_slice.count <= 0 || col_slice.begin + col_slice.count > cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice rows [", row_slice.begin, ", +", row_slice.count,
                     ") cols [", col_slice.begin, ", +", col_slice.count,
                     ") is outside ", wname, " [", rows, ", ", cols, "]"));
  }
  if (headers_only_) return std::unique_ptr<gpu::Weight>();
  const int64_t r0 = row_slice.begin, rn = row_slice.count;
  const int64_t c0 = col_slice.begin, cn = col_slice.count;
  const bool whole = rn == rows && cn == cols;

  bool aligned = true;
  if (w.format == gpu::WeightFormat::kFp8Block) {
    aligned = Aligned(r0, rn, rows, w.block_rows) &&
              Aligned(c0, cn, cols, w.block_cols);
  } else if (scale_block_cols > 0) {
    aligned = Aligned(c0, cn, cols, scale_block_cols);
  }

  std::vector<uint8_t> sliced_data, sliced_scale;
  gpu::HostWeight out = w;
  out.rows = rn;
  out.cols = cn;
  if (whole) {
    out.data = data;
    out.scale = scale;
  } else if (aligned) {
    if (w.format == gpu::WeightFormat::kF32 ||
        w.format == gpu::WeightFormat::kBf16 ||
        w.format == gpu::WeightFormat::kFp8Block) {
      const int64_t es = w.format == gpu::WeightFormat::kF32    ? 4
                         : w.format == gpu::WeightFormat::kBf16 ? 2
                                                                : 1;
      sliced_data = SliceBytes(data, cols * es, r0, rn, c0 * es, cn * es);
    } else {
      sliced_data = SliceBytes(data, cols / 2, r0, rn, c0 / 2, cn / 2);
    }
    if (w.format == gpu::WeightFormat::kFp8Block) {
      const int64_t sr0 = r0 / w.block_rows;
      const int64_t srn = CeilDiv(r0 + rn, w.block_rows) - sr0;
      const int64_t sc0 = c0 / w.block_cols;
      const int64_t scn = CeilDiv(c0 + cn, w.block_cols) - sc0;
      sliced_scale =
          SliceBytes(scale, CeilDiv(cols, w.block_cols), sr0, srn, sc0, scn);
    } else if (scale_block_cols > 0) {
      sliced_scale = SliceBytes(scale, cols / scale_block_cols, r0, rn,
                                c0 / scale_block_cols, cn / scale_block_cols);
    }
    out.data = sliced_data;
    out.scale = sliced_scale;
  } else {
    w.data = data;
    w.scale = scale;
    absl::StatusOr<std::vector<float>> values = gpu::DequantizeHostWeight(w);
    if (!values.ok()) {
      return absl::Status(values.status().code(),
                          absl::StrCat(Where(), "tensor ", wname, ": ",
                                       values.status().message()));
    }
    sliced_data.resize(static_cast<size_t>(rn * cn * 4));
    for (int64_t r = 0; r < rn; ++r) {
      std::memcpy(sliced_data.data() + r * cn * 4,
                  values->data() + (r0 + r) * cols + c0,
                  static_cast<size_t>(cn * 4));
    }
    out.format = gpu::WeightFormat::kF32;
    out.data = sliced_data;
    out.scale = {};
  }
  absl::StatusOr<std::unique_ptr<gpu::Weight>> uploaded =
      backend_.UploadWeight(out);
  if (!uploaded.ok()) {
    return absl::Status(uploaded.status().code(),
                        absl::StrCat(Where(), "tensor ", wname, ": ",
                                     uploaded.status().message()));
  }
  uploaded_bytes_ += (*uploaded)->bytes();
  return uploaded;
}

absl::StatusOr<std::vector<float>> WeightLoader::Floats(
    absl::string_view name, const std::vector<int64_t>& shape, int64_t begin,
    int64_t count) {
  checkpoint::TensorSpec spec;
  ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                   Read(name, {DType::kF32, DType::kBf16}, shape, &spec));
  int64_t n = 1;
  for (int64_t dim : spec.shape) n *= dim;
  if (count < 0) count = n - begin;
  if (begin < 0 || count < 0 || begin + count > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("elements [", begin, ", +", count, ") outside ", name));
  }
  std::vector<float> out(static_cast<size_t>(count));
  if (headers_only_) return out;
  for (int64_t i = 0; i < count; ++i) {
    if (spec.dtype == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + (begin + i) * 4, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, bytes.data() + (begin + i) * 2, 2);
      out[i] = formats::Bf16ToFloat(b);
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> WeightLoader::Integers(
    absl::string_view name, const std::vector<int64_t>& shape) {
  checkpoint::TensorSpec spec;
  ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                   Read(name, {DType::kI64, DType::kI32}, shape, &spec));
  const size_t width = spec.dtype == DType::kI64 ? 8 : 4;
  std::vector<int64_t> out(bytes.size() / width);
  for (size_t i = 0; i < out.size(); ++i) {
    if (width == 8) {
      std::memcpy(&out[i], bytes.data() + i * 8, 8);
    } else {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      out[i] = v;
    }
  }
  return out;
}

absl::Status WeightLoader::Check(absl::string_view name,
                                 const std::vector<checkpoint::DType>& dtypes,
                                 const std::vector<int64_t>& shape) const {
  absl::StatusOr<checkpoint::TensorSpec> spec = source_.GetTensorSpec(name);
  if (!spec.ok()) {
    return absl::NotFoundError(
        absl::StrCat(Where(), "tensor ", name, " is missing"));
  }
  if (std::find(dtypes.begin(), dtypes.end(), spec->dtype) == dtypes.end()) {
    std::string want;
    for (DType d : dtypes) {
      absl::StrAppend(&want, want.empty() ? "" : " or ",
                      checkpoint::DTypeName(d));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), name, " has dtype ",
                     checkpoint::DTypeName(spec->dtype), ", expected ", want));
  }
  if (spec->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), name, " has shape [", absl::StrJoin(spec->shape, ", "),
        "], expected [", absl::StrJoin(shape, ", "), "]"));
  }
  return absl::OkStatus();
}

absl::Status WeightLoader::CheckLinear(absl::string_view name, int64_t rows,
                                       int64_t cols) const {
  const std::string w = absl::StrCat(name, ".weight");
  absl::StatusOr<checkpoint::TensorSpec> spec = source_.GetTensorSpec(w);
  if (!spec.ok()) {
    return absl::NotFoundError(
        absl::StrCat(Where(), "tensor ", w, " is missing"));
  }
  switch (spec->dtype) {
    case DType::kF32:
    case DType::kBf16:
      return Check(w, {DType::kF32, DType::kBf16}, {rows, cols});
    case DType::kF8E4M3: {
      RETURN_IF_ERROR(Check(w, {DType::kF8E4M3}, {rows, cols}));
      return Check(absl::StrCat(name, ".scale"), {DType::kF8E8M0, DType::kF32},
                   {(rows + fp8_block_rows_ - 1) / fp8_block_rows_,
                    (cols + fp8_block_cols_ - 1) / fp8_block_cols_});
    }
    case DType::kU8:
    case DType::kI8: {
      RETURN_IF_ERROR(Check(w, {DType::kU8, DType::kI8}, {rows, cols / 2}));
      if (source_.GetTensorSpec(absl::StrCat(name, ".weight_scale")).ok()) {
        return Check(absl::StrCat(name, ".weight_scale"), {DType::kF8E4M3},
                     {rows, cols / 16});
      }
      return Check(absl::StrCat(name, ".scale"), {DType::kF8E8M0},
                   {rows, cols / 32});
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), w, " has dtype ", checkpoint::DTypeName(spec->dtype),
          ", not a linear weight format"));
  }
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::FloatMatrix(
    absl::string_view name, int64_t rows, int64_t cols) {
  ASSIGN_OR_RETURN(const std::vector<float> values, Floats(name, {rows, cols}));
  if (headers_only_) return std::unique_ptr<gpu::Weight>();
  gpu::HostWeight w;
  w.format = gpu::WeightFormat::kF32;
  w.rows = rows;
  w.cols = cols;
  w.data = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()),
                               values.size() * 4);
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Weight> uploaded,
                   backend_.UploadWeight(w));
  uploaded_bytes_ += uploaded->bytes();
  return uploaded;
}

absl::StatusOr<std::unique_ptr<gpu::Buffer>> WeightLoader::Vector(
    absl::string_view name, const std::vector<int64_t>& shape, int64_t begin,
    int64_t count) {
  ASSIGN_OR_RETURN(const std::vector<float> values,
                   Floats(name, shape, begin, count));
  if (headers_only_) return std::unique_ptr<gpu::Buffer>();
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> buffer,
                   backend_.Allocate(static_cast<int64_t>(values.size())));
  backend_.CopyFromHost(values, buffer->data());
  uploaded_bytes_ += static_cast<int64_t>(values.size()) * 4;
  return buffer;
}

}  // namespace mneme::model
