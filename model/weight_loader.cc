#include "model/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "formats/exl3/exl3.h"
#include "formats/gridbook/gridbook.h"
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

absl::Status WeightLoader::ResolveSlices(absl::string_view wname, int64_t rows,
                                         int64_t cols, Slice& row_slice,
                                         Slice& col_slice) const {
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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::Upload(
    const gpu::HostWeight& weight, absl::string_view wname) {
  absl::StatusOr<std::unique_ptr<gpu::Weight>> uploaded =
      backend_.UploadWeight(weight);
  if (!uploaded.ok()) {
    return absl::Status(uploaded.status().code(),
                        absl::StrCat(Where(), "tensor ", wname, ": ",
                                     uploaded.status().message()));
  }
  uploaded_bytes_ += (*uploaded)->bytes();
  return uploaded;
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::SliceAsFloats(
    const gpu::HostWeight& weight, absl::string_view wname, Slice row_slice,
    Slice col_slice) {
  absl::StatusOr<std::vector<float>> values = gpu::DequantizeHostWeight(weight);
  if (!values.ok()) {
    return absl::Status(values.status().code(),
                        absl::StrCat(Where(), "tensor ", wname, ": ",
                                     values.status().message()));
  }
  const int64_t rn = row_slice.count;
  const int64_t cn = col_slice.count;
  std::vector<uint8_t> sliced(static_cast<size_t>(rn * cn * 4));
  for (int64_t r = 0; r < rn; ++r) {
    std::memcpy(
        sliced.data() + r * cn * 4,
        values->data() + (row_slice.begin + r) * weight.cols + col_slice.begin,
        static_cast<size_t>(cn * 4));
  }
  gpu::HostWeight out;
  out.format = gpu::WeightFormat::kF32;
  out.rows = rn;
  out.cols = cn;
  out.data = sliced;
  // A W4A4 weight's slice keeps its activation contract.
  out.gridbook_input_scale = weight.gridbook_input_scale;
  return Upload(out, wname);
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::Linear(
    absl::string_view name, int64_t rows, int64_t cols, Slice row_slice,
    Slice col_slice) {
  if (gridbook_ != nullptr) {
    if (const std::optional<checkpoint::GridbookPlacement> placement =
            gridbook_->Find(name)) {
      return GridbookLinear(name, *placement, rows, cols, row_slice, col_slice);
    }
  }
  if (Has(absl::StrCat(name, ".trellis"))) {
    return Exl3Linear(name, rows, cols, row_slice, col_slice);
  }
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

  RETURN_IF_ERROR(ResolveSlices(wname, rows, cols, row_slice, col_slice));
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
    return SliceAsFloats(w, wname, row_slice, col_slice);
  }
  return Upload(out, wname);
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::Exl3Linear(
    absl::string_view name, int64_t rows, int64_t cols, Slice row_slice,
    Slice col_slice) {
  const std::string tname = absl::StrCat(name, ".trellis");
  ASSIGN_OR_RETURN(const int bits, CheckExl3(name, rows, cols));
  RETURN_IF_ERROR(ResolveSlices(tname, rows, cols, row_slice, col_slice));
  if (headers_only_) return std::unique_ptr<gpu::Weight>();
  ASSIGN_OR_RETURN(const std::vector<uint8_t> trellis,
                   source_.ReadTensorBytes(tname));
  // suh then svh as fp16; the legacy packed signs become +-1.
  std::vector<uint8_t> scales;
  for (const auto& [scaled, packed, count] :
       {std::tuple{".suh", ".su", cols}, std::tuple{".svh", ".sv", rows}}) {
    const std::string scaled_name = absl::StrCat(name, scaled);
    if (Has(scaled_name)) {
      ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                       source_.ReadTensorBytes(scaled_name));
      scales.insert(scales.end(), bytes.begin(), bytes.end());
      continue;
    }
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                     source_.ReadTensorBytes(absl::StrCat(name, packed)));
    std::vector<uint16_t> words(bytes.size() / 2);
    std::memcpy(words.data(), bytes.data(), words.size() * 2);
    std::vector<float> signs(static_cast<size_t>(count));
    formats::exl3::UnpackSigns(words.data(), count, signs.data());
    for (const float sign : signs) {
      const uint16_t half = sign < 0 ? 0xBC00 : 0x3C00;  // fp16 -1 / +1
      scales.push_back(static_cast<uint8_t>(half & 0xFF));
      scales.push_back(static_cast<uint8_t>(half >> 8));
    }
  }
  gpu::HostWeight w;
  w.format = gpu::WeightFormat::kExl3;
  w.rows = rows;
  w.cols = cols;
  w.exl3_bits = bits;
  w.exl3_codebook = formats::exl3::SelectCodebook(
      Has(absl::StrCat(name, ".mcg")), Has(absl::StrCat(name, ".mul1")));
  w.data = trellis;
  w.scale = scales;
  const int64_t r0 = row_slice.begin, rn = row_slice.count;
  const int64_t c0 = col_slice.begin, cn = col_slice.count;
  if (rn == rows && cn == cols) return Upload(w, tname);
  constexpr int64_t kBlock = formats::exl3::kHadamardSize;
  if (!Aligned(r0, rn, rows, kBlock) || !Aligned(c0, cn, cols, kBlock)) {
    return SliceAsFloats(w, tname, row_slice, col_slice);
  }
  // Whole 128 blocks: the tiles of the slice (trellis dim 0 = inputs,
  // dim 1 = outputs) and the matching scales.
  const int64_t tile_bytes = int64_t{2} * 16 * bits;
  const int64_t tiles_out = rows / 16;
  std::vector<uint8_t> sliced =
      SliceBytes(trellis, tiles_out * tile_bytes, c0 / 16, cn / 16,
                 r0 / 16 * tile_bytes, rn / 16 * tile_bytes);
  std::vector<uint8_t> sliced_scales(static_cast<size_t>(2 * (rn + cn)));
  std::memcpy(sliced_scales.data(), scales.data() + 2 * c0,
              static_cast<size_t>(2 * cn));
  std::memcpy(sliced_scales.data() + 2 * cn, scales.data() + 2 * (cols + r0),
              static_cast<size_t>(2 * rn));
  w.rows = rn;
  w.cols = cn;
  w.data = sliced;
  w.scale = sliced_scales;
  return Upload(w, tname);
}

namespace {

// Rows of the physical matrix (per expert) a placement needs: the module's
// rows, twice that for a half of gate_up_proj.
int64_t PhysicalRows(const checkpoint::GridbookPlacement& p, int64_t rows) {
  return p.rows == checkpoint::GridbookPlacement::Rows::kAll ? rows : 2 * rows;
}

// The first physical row of the module.
int64_t FirstRow(const checkpoint::GridbookPlacement& p, int64_t rows) {
  return p.rows == checkpoint::GridbookPlacement::Rows::kSecondHalf ? rows : 0;
}

}  // namespace

absl::Status WeightLoader::CheckGridbook(absl::string_view name,
                                         const checkpoint::GridbookPlacement& p,
                                         int64_t rows, int64_t cols) const {
  namespace gb = formats::gridbook;
  const gb::Scheme& scheme = p.group->scheme;
  if (cols % gb::kSuperblock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), "GridBook module ", name, " has ", cols,
                     " input features, not a multiple of 256"));
  }
  const int64_t physical_rows = PhysicalRows(p, rows);
  const int64_t row_bytes = cols / gb::kSuperblock * gb::TypeSize(scheme);
  const std::string qweight = absl::StrCat(p.tensor, ".cb_qweight");
  ASSIGN_OR_RETURN(const checkpoint::TensorSpec spec,
                   source_.GetTensorSpec(qweight));
  std::vector<int64_t> expected = {physical_rows, row_bytes};
  if (p.expert >= 0) {
    if (spec.shape.size() != 3 || p.expert >= spec.shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), "GridBook tensor ", qweight, " has shape ",
                       ShapeString(spec.shape), ", which holds no expert ",
                       p.expert, " of ", name));
    }
    expected.insert(expected.begin(), spec.shape[0]);
  }
  if (spec.dtype != DType::kU8 || spec.shape != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "GridBook tensor ", qweight, " is ",
        checkpoint::DTypeName(spec.dtype), " ", ShapeString(spec.shape), "; ",
        name, " (", p.group->format, ", config group \"", p.group->name,
        "\") needs U8 ", ShapeString(expected)));
  }
  if (scheme.grid == gb::Grid::kFp8) {
    std::vector<int64_t> shape = {physical_rows};
    if (p.expert >= 0) shape.insert(shape.begin(), expected[0]);
    RETURN_IF_ERROR(
        Check(absl::StrCat(p.tensor, ".weight_scale"), {DType::kF32}, shape));
  }
  if (p.group->w4a4) {
    RETURN_IF_ERROR(Check(absl::StrCat(p.tensor, ".input_global_scale"),
                          {DType::kF32}, {1}));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<gpu::Weight>> WeightLoader::GridbookLinear(
    absl::string_view name, const checkpoint::GridbookPlacement& p,
    int64_t rows, int64_t cols, Slice row_slice, Slice col_slice) {
  namespace gb = formats::gridbook;
  RETURN_IF_ERROR(CheckGridbook(name, p, rows, cols));
  const std::string qweight = absl::StrCat(p.tensor, ".cb_qweight");
  RETURN_IF_ERROR(ResolveSlices(qweight, rows, cols, row_slice, col_slice));
  if (headers_only_) return std::unique_ptr<gpu::Weight>();
  const gb::Scheme& scheme = p.group->scheme;
  const int64_t type_size = gb::TypeSize(scheme);
  const int64_t row_bytes = cols / gb::kSuperblock * type_size;
  // The module's rows [r0, r0 + rn) of the (expert's) physical matrix.
  const int64_t physical_rows = PhysicalRows(p, rows);
  const int64_t first = (p.expert >= 0 ? p.expert * physical_rows : 0) +
                        FirstRow(p, rows) + row_slice.begin;
  const int64_t rn = row_slice.count;
  std::vector<uint8_t> data(static_cast<size_t>(rn * row_bytes));
  RETURN_IF_ERROR(source_.ReadTensorByteRange(
      qweight, static_cast<uint64_t>(first * row_bytes), absl::MakeSpan(data)));
  std::vector<uint8_t> scale;
  if (scheme.grid == gb::Grid::kFp8) {
    scale.resize(static_cast<size_t>(rn * 4));
    RETURN_IF_ERROR(source_.ReadTensorByteRange(
        absl::StrCat(p.tensor, ".weight_scale"),
        static_cast<uint64_t>(first * 4), absl::MakeSpan(scale)));
  }
  gpu::HostWeight w;
  w.format = gpu::WeightFormat::kGridbook;
  w.rows = rn;
  w.cols = cols;
  w.gridbook_scheme = scheme;
  w.gridbook_books = p.books;
  if (p.group->w4a4) {
    ASSIGN_OR_RETURN(
        const std::vector<float> g,
        Floats(absl::StrCat(p.tensor, ".input_global_scale"), {1}));
    if (!(g[0] > 0.0f) || !std::isfinite(g[0])) {
      return absl::DataLossError(
          absl::StrCat(Where(), "tensor ", p.tensor,
                       ".input_global_scale is not a positive finite scale"));
    }
    w.gridbook_input_scale = g[0];
  }
  w.data = data;
  w.scale = scale;
  const int64_t c0 = col_slice.begin, cn = col_slice.count;
  if (cn == cols) return Upload(w, qweight);
  if (!Aligned(c0, cn, cols, gb::kSuperblock)) {
    return SliceAsFloats(w, qweight, Slice{0, rn}, col_slice);
  }
  // Whole superblocks of each row.
  std::vector<uint8_t> sliced =
      SliceBytes(data, row_bytes, 0, rn, c0 / gb::kSuperblock * type_size,
                 cn / gb::kSuperblock * type_size);
  w.cols = cn;
  w.data = sliced;
  return Upload(w, qweight);
}

absl::StatusOr<int> WeightLoader::CheckExl3(absl::string_view name,
                                            int64_t rows, int64_t cols) const {
  const std::string tname = absl::StrCat(name, ".trellis");
  ASSIGN_OR_RETURN(const checkpoint::TensorSpec spec,
                   source_.GetTensorSpec(tname));
  if (spec.dtype != DType::kI16 || spec.shape.size() != 3 ||
      spec.shape[0] * 16 != cols || spec.shape[1] * 16 != rows ||
      spec.shape[2] % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "EXL3 tensor ", tname, " is ",
        checkpoint::DTypeName(spec.dtype), " ", ShapeString(spec.shape), "; a ",
        rows, " x ", cols, " weight needs I16 [", cols / 16, ", ", rows / 16,
        ", 16 * K]"));
  }
  const int bits = static_cast<int>(spec.shape[2] / 16);
  if (absl::Status status = formats::exl3::ValidateExl3Shape(cols, rows, bits);
      !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), "EXL3 module ", name, ": ", status.message()));
  }
  for (const char* refused : {".bias", ".scale", ".weight"}) {
    if (Has(absl::StrCat(name, refused))) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), "EXL3 module ", name, " also has ", name,
                       refused, " (not part of an EXL3 linear of this model)"));
    }
  }
  if (Has(absl::StrCat(name, ".mcg")) && Has(absl::StrCat(name, ".mul1"))) {
    // exllamav3's GEMM refuses this too ("Specified both mcg and mul1").
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), "EXL3 module ", name,
                     " names both the mcg and mul1 codebooks"));
  }
  for (const auto& [scaled, packed, count] :
       {std::tuple{".suh", ".su", cols}, std::tuple{".svh", ".sv", rows}}) {
    if (Has(absl::StrCat(name, scaled))) {
      RETURN_IF_ERROR(
          Check(absl::StrCat(name, scaled), {DType::kF16}, {count}));
    } else if (Has(absl::StrCat(name, packed))) {
      RETURN_IF_ERROR(
          Check(absl::StrCat(name, packed), {DType::kI16}, {count / 16}));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), "EXL3 module ", name, " has neither ", name,
                       scaled, " nor ", name, packed));
    }
  }
  return bits;
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

absl::StatusOr<std::pair<int64_t, int64_t>> WeightLoader::LinearShape(
    absl::string_view name) const {
  namespace gb = formats::gridbook;
  if (gridbook_ != nullptr) {
    if (const std::optional<checkpoint::GridbookPlacement> p =
            gridbook_->Find(name)) {
      ASSIGN_OR_RETURN(
          const checkpoint::TensorSpec spec,
          source_.GetTensorSpec(absl::StrCat(p->tensor, ".cb_qweight")));
      const size_t rank = p->expert >= 0 ? 3 : 2;
      if (spec.shape.size() != rank) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(), p->tensor, ".cb_qweight has shape ",
                         ShapeString(spec.shape)));
      }
      int64_t rows = spec.shape[rank - 2];
      if (p->rows != checkpoint::GridbookPlacement::Rows::kAll) rows /= 2;
      return std::pair<int64_t, int64_t>{
          rows, spec.shape[rank - 1] / gb::TypeSize(p->group->scheme) *
                    gb::kSuperblock};
    }
  }
  if (absl::StatusOr<checkpoint::TensorSpec> trellis =
          source_.GetTensorSpec(absl::StrCat(name, ".trellis"));
      trellis.ok() && trellis->shape.size() == 3) {
    return std::pair<int64_t, int64_t>{trellis->shape[1] * 16,
                                       trellis->shape[0] * 16};
  }
  ASSIGN_OR_RETURN(const checkpoint::TensorSpec spec,
                   source_.GetTensorSpec(absl::StrCat(name, ".weight")));
  if (spec.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), name, ".weight has shape ",
                     ShapeString(spec.shape), ", not a matrix"));
  }
  const bool fp4 = spec.dtype == DType::kU8 || spec.dtype == DType::kI8;
  return std::pair<int64_t, int64_t>{spec.shape[0],
                                     fp4 ? 2 * spec.shape[1] : spec.shape[1]};
}

absl::Status WeightLoader::CheckLinear(absl::string_view name, int64_t rows,
                                       int64_t cols) const {
  if (gridbook_ != nullptr) {
    if (const std::optional<checkpoint::GridbookPlacement> placement =
            gridbook_->Find(name)) {
      return CheckGridbook(name, *placement, rows, cols);
    }
  }
  if (Has(absl::StrCat(name, ".trellis"))) {
    return CheckExl3(name, rows, cols).status();
  }
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
