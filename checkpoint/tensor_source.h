#ifndef MNEME_CHECKPOINT_TENSOR_SOURCE_H_
#define MNEME_CHECKPOINT_TENSOR_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/dtype.h"

namespace mneme::checkpoint {

// What a tensor is, without its bytes.
struct TensorSpec {
  DType dtype = DType::kU8;
  // Dimensions, outermost first; empty for a scalar. Each is >= 0.
  std::vector<int64_t> shape;
  // Bytes of the tensor: product of `shape` x DTypeSize(dtype).
  uint64_t byte_length = 0;
};

// A set of named tensors on disk: the seam between an on-disk checkpoint
// format and its readers (the model's weight loader, the quantizer and the
// other tools). A new format is a new TensorSource; nothing that reads
// weights has to change.
//
// Implementations: SafetensorsReader (one file) and ShardedCheckpoint (a
// Hugging Face checkpoint directory). tests/checkpoint/tensor_source_test.cc
// runs the same cases over each; a new implementation joins that suite.
//
// Error codes, the same for every implementation (messages name the source
// and the tensor):
//   NotFound    `name` is not a tensor of this source.
//   OutOfRange  a byte range that does not lie inside the tensor.
//   DataLoss    the bytes cannot all be read (the file became shorter since
//               the source was opened, or is corrupt).
//   other       errno-derived codes for I/O failures.
//
// Thread-safe: every method is const and may be called concurrently; the
// set of tensors does not change after the source is created.
class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // The name of every tensor, sorted ascending, without duplicates.
  virtual std::vector<std::string> TensorNames() const = 0;

  // The dtype, shape and byte length of tensor `name`. NotFound if absent.
  virtual absl::StatusOr<TensorSpec> GetTensorSpec(
      absl::string_view name) const = 0;

  // All bytes of tensor `name` (spec.byte_length of them). NotFound if
  // absent; DataLoss on a short read.
  virtual absl::StatusOr<std::vector<uint8_t>> ReadTensorBytes(
      absl::string_view name) const = 0;

  // out.size() bytes of tensor `name` starting `offset` bytes into it.
  // NotFound if absent; OutOfRange (nothing read) unless
  // offset + out.size() <= spec.byte_length; DataLoss on a short read.
  virtual absl::Status ReadTensorByteRange(absl::string_view name,
                                           uint64_t offset,
                                           absl::Span<uint8_t> out) const = 0;
};

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_TENSOR_SOURCE_H_
