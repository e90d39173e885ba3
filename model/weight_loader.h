#ifndef MNEME_MODEL_WEIGHT_LOADER_H_
#define MNEME_MODEL_WEIGHT_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"
#include "checkpoint/gridbook_artifact.h"
#include "checkpoint/tensor_source.h"
#include "gpu/backend.h"

namespace mneme::model {

// A contiguous part [begin, begin + count) of a weight's rows or columns
// (one tensor-parallel rank's share). count < 0 = to the end.
struct Slice {
  int64_t begin = 0;
  int64_t count = -1;
};

// Loads a rank's share of checkpoint tensors into a backend, checking every
// dtype and shape against what the config implies (messages name the tensor
// and the source). It reads through a checkpoint::TensorSource, so a new
// on-disk format needs no change here. Linear weights are found by their name
// without the
// ".weight" suffix; the format follows from the stored dtypes:
//   F32 / BF16 .weight                           dense
//   F8_E4M3 .weight + F8_E8M0 .scale             FP8, fp8 block shape
//   U8 / I8 .weight [out, in / 2] + F8_E8M0 .scale [out, in / 32]   MXFP4
//   U8 .weight + F8_E4M3 .weight_scale + F32 .weight_scale_2        NVFP4
//   I16 .trellis [cols / 16, rows / 16, 16 K] + F16 .suh [cols] (or I16
//   .su) + F16 .svh [rows] (or I16 .sv), .mcg / .mul1 markers    EXL3
// and, with a GridBook artifact set (set_gridbook), its codebook targets:
//   U8 .cb_qweight [rows, cols / 256 * type_size] (+ F32 .weight_scale
//   [rows] on fp8 rungs, F32 .input_global_scale [1] with the W4A4
//   contract); routed experts from the stacked [E, rows(x2), ...] tensors
// A slice that does not fall on the format's scale blocks (EXL3: 128 x 128
// Hadamard blocks) is loaded as the dequantized fp32 values of the slice
// (same numbers, more bytes).
//
// Thread-compatible; the borrowed source and backend outlive it.
class WeightLoader {
 public:
  // `source_name` (e.g. the checkpoint directory) prefixes error messages.
  WeightLoader(const checkpoint::TensorSource& source, gpu::Backend& backend,
               int fp8_block_rows, int fp8_block_cols,
               std::string source_name = "")
      : source_(source),
        backend_(backend),
        fp8_block_rows_(fp8_block_rows),
        fp8_block_cols_(fp8_block_cols),
        source_name_(std::move(source_name)) {}

  // The linear weight `name`.weight of shape [rows, cols], sliced. NotFound
  // for a missing tensor; InvalidArgument for a dtype or shape that does not
  // match; DataLoss for a corrupt scale.
  absl::StatusOr<std::unique_ptr<gpu::Weight>> Linear(absl::string_view name,
                                                      int64_t rows,
                                                      int64_t cols,
                                                      Slice row_slice = {},
                                                      Slice col_slice = {});
  // A dense tensor (F32 or BF16) `name` of `shape` as fp32 host values,
  // elements [begin, begin + count) of its flattened form (count < 0 = all).
  absl::StatusOr<std::vector<float>> Floats(absl::string_view name,
                                            const std::vector<int64_t>& shape,
                                            int64_t begin = 0,
                                            int64_t count = -1);
  // A dense tensor `name` (exact name, F32 or BF16) of shape [rows, cols]
  // uploaded as an fp32 matrix (e.g. the hyper-connection projections).
  absl::StatusOr<std::unique_ptr<gpu::Weight>> FloatMatrix(
      absl::string_view name, int64_t rows, int64_t cols);
  // Floats() copied into a new backend buffer.
  absl::StatusOr<std::unique_ptr<gpu::Buffer>> Vector(
      absl::string_view name, const std::vector<int64_t>& shape,
      int64_t begin = 0, int64_t count = -1);

  // An integer tensor (I64 or I32) `name` of `shape`, all elements.
  absl::StatusOr<std::vector<int64_t>> Integers(
      absl::string_view name, const std::vector<int64_t>& shape);
  // Checks the header of tensor `name` (exact name) without reading it:
  // NotFound when missing, InvalidArgument naming the dtype or shape.
  absl::Status Check(absl::string_view name,
                     const std::vector<checkpoint::DType>& dtypes,
                     const std::vector<int64_t>& shape) const;
  // The same for the linear weight `name` of shape [rows, cols] in any of
  // Linear's formats (with its scales).
  absl::Status CheckLinear(absl::string_view name, int64_t rows,
                           int64_t cols) const;

  // The GridBook artifact of the checkpoint (borrowed; outlives the loader),
  // or null. Modules it names as codebook targets load from its tensors.
  void set_gridbook(const checkpoint::GridbookArtifact* artifact) {
    gridbook_ = artifact;
  }

  // The [rows, cols] of linear weight `name` (the model's orientation: rows
  // = output features) from its stored tensors in any of Linear's formats.
  // NotFound when no format's tensors are there.
  absl::StatusOr<std::pair<int64_t, int64_t>> LinearShape(
      absl::string_view name) const;

  // Whether the source has a tensor `name` (an optional weight).
  bool Has(absl::string_view name) const {
    return source_.GetTensorSpec(name).ok();
  }

  // Checks names, dtypes, shapes and slices against the headers only: no
  // tensor data is read and nothing is uploaded (Linear, FloatMatrix and
  // Vector return null, Floats zeros, Integers nothing). For validating a
  // checkpoint without its data (mneme plan on full-shape checkpoints).
  void set_headers_only(bool headers_only) { headers_only_ = headers_only; }
  bool headers_only() const { return headers_only_; }

  // Bytes uploaded so far.
  int64_t uploaded_bytes() const { return uploaded_bytes_; }

 private:
  absl::StatusOr<std::vector<uint8_t>> Read(
      absl::string_view name, const std::vector<checkpoint::DType>& dtypes,
      const std::vector<int64_t>& shape, checkpoint::TensorSpec* spec);
  // "<source_name>: " (empty without a name), for messages.
  std::string Where() const;
  // Resolves count < 0 and checks the slices lie inside [rows, cols].
  absl::Status ResolveSlices(absl::string_view wname, int64_t rows,
                             int64_t cols, Slice& row_slice,
                             Slice& col_slice) const;
  // UploadWeight with the tensor named in errors; counts uploaded_bytes_.
  absl::StatusOr<std::unique_ptr<gpu::Weight>> Upload(
      const gpu::HostWeight& weight, absl::string_view wname);
  // The slice of a weight as its dequantized fp32 values.
  absl::StatusOr<std::unique_ptr<gpu::Weight>> SliceAsFloats(
      const gpu::HostWeight& weight, absl::string_view wname, Slice row_slice,
      Slice col_slice);
  // EXL3 modules (`name`.trellis): the bits per weight after checking every
  // tensor of the module.
  absl::StatusOr<int> CheckExl3(absl::string_view name, int64_t rows,
                                int64_t cols) const;
  // GridBook codebook targets: the host weight of `placement` (the bytes of
  // its rows read into *data / *scale), checked against [rows, cols].
  absl::Status CheckGridbook(absl::string_view name,
                             const checkpoint::GridbookPlacement& placement,
                             int64_t rows, int64_t cols) const;
  absl::StatusOr<std::unique_ptr<gpu::Weight>> GridbookLinear(
      absl::string_view name, const checkpoint::GridbookPlacement& placement,
      int64_t rows, int64_t cols, Slice row_slice, Slice col_slice);
  absl::StatusOr<std::unique_ptr<gpu::Weight>> Exl3Linear(
      absl::string_view name, int64_t rows, int64_t cols, Slice row_slice,
      Slice col_slice);

  const checkpoint::TensorSource& source_;
  gpu::Backend& backend_;
  const int fp8_block_rows_;
  const int fp8_block_cols_;
  const std::string source_name_;
  int64_t uploaded_bytes_ = 0;
  bool headers_only_ = false;
  const checkpoint::GridbookArtifact* gridbook_ = nullptr;
};

}  // namespace mneme::model

#endif  // MNEME_MODEL_WEIGHT_LOADER_H_
