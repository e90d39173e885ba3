#ifndef MNEME_CHECKPOINT_SAFETENSORS_WRITER_H_
#define MNEME_CHECKPOINT_SAFETENSORS_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_header.h"
#include "common/file_io.h"

namespace mneme::checkpoint {

// A tensor to be written: declared before any bytes are.
struct TensorDecl {
  std::string name;
  DType dtype = DType::kU8;
  // Dimensions, outermost first; each >= 0. Empty for a scalar.
  std::vector<int64_t> shape;
};

// Everything before the data region of a safetensors file whose tensors are
// laid out contiguously in declaration order, as EncodeSafetensorsHeader()
// builds it.
struct EncodedSafetensorsHeader {
  // The 8-byte little-endian length N followed by the N bytes of the JSON
  // header, padded with spaces to a multiple of 8 bytes (as the reference
  // implementation does).
  std::string prefix;
  // Each tensor with its absolute offset in the file, in declaration order.
  std::vector<TensorInfo> layout;
  // Sum of the tensors' byte lengths.
  uint64_t data_bytes = 0;
};

// The one safetensors header encoder: SafetensorsWriter and the tools that
// write shards in place use it, so every file Mneme writes has the same
// header bytes for the same declarations. The JSON holds "__metadata__"
// first (only when `metadata` is non-empty), then the tensors in declaration
// order, compact (no whitespace). InvalidArgument for an empty or duplicate
// name, the name "__metadata__", a negative dimension, a size that overflows
// 64 bits or the largest file size, or a name or metadata string that is not
// valid UTF-8; messages start with `context`, which names the file (e.g.
// "safetensors writer for 'dir/m.safetensors'"), followed by ", tensor
// 'name': <what>" or ": <what>".
absl::StatusOr<EncodedSafetensorsHeader> EncodeSafetensorsHeader(
    std::vector<TensorDecl> tensors,
    const std::map<std::string, std::string>& metadata,
    absl::string_view context);

struct SafetensorsWriterOptions {
  // The header's "__metadata__" map. Default: empty (no "__metadata__" key).
  std::map<std::string, std::string> metadata;
  // Bytes buffered per partially written tensor before they are written out,
  // so that callers may append small chunks (e.g. one row at a time,
  // alternating between tensors). 0 writes every chunk straight through.
  // Default: 1 MiB.
  size_t buffer_bytes = size_t{1} << 20;
};

// Streams a safetensors file whose tensors are declared up front, so that
// multi-GB tensors never have to be held in memory.
//
// Create() lays the tensors out contiguously in declaration order, writes the
// header (JSON padded with spaces to a multiple of 8 bytes, as the reference
// implementation does) into a temporary file next to `path`. The caller then
// Append()s each tensor's bytes, in order within a tensor, in chunks of any
// size; tensors may be filled in any order or interleaved. Finish() checks
// that every tensor got exactly its byte length, fsyncs, and renames the
// temporary file onto `path`: a partial file never appears under `path`.
// Destroying the writer without a successful Finish() deletes the temporary
// file.
//
// Not thread-safe: one caller at a time.
class SafetensorsWriter {
 public:
  // InvalidArgument (naming the field or tensor) for an empty or duplicate
  // name, the name "__metadata__", a negative dimension, a size that
  // overflows 64 bits, or a name or metadata string that is not valid UTF-8;
  // errno-derived codes if the temporary file cannot be created.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorDecl> tensors,
      const SafetensorsWriterOptions& options = {});

  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Where the file will appear after Finish().
  const std::string& path() const { return path_; }
  // Where each declared tensor will be (absolute offsets), in declaration
  // order.
  const std::vector<TensorInfo>& layout() const { return layout_; }
  // Sum of the tensors' byte lengths (the index's metadata.total_size).
  uint64_t data_bytes() const { return data_bytes_; }

  // Appends `bytes` to tensor `name`. NotFound for an undeclared tensor;
  // InvalidArgument (nothing written) if the tensor would exceed its byte
  // length; FailedPrecondition after Finish() or after an I/O error, which
  // is returned once and then remembered.
  absl::Status Append(absl::string_view name, absl::Span<const uint8_t> bytes);

  // Commits the file. FailedPrecondition (naming the first incomplete tensor;
  // the writer stays usable) if a tensor is short, or if already finished or
  // failed; errno-derived codes for I/O errors.
  absl::Status Finish();

 private:
  struct TensorState {
    uint64_t written = 0;         // Bytes appended so far.
    uint64_t flushed = 0;         // Bytes of those already in the file.
    std::vector<uint8_t> buffer;  // Appended but not yet written.
  };

  SafetensorsWriter(std::string path, std::string temp_path, ScopedFd fd,
                    std::vector<TensorInfo> layout, uint64_t data_bytes,
                    size_t buffer_bytes);

  absl::Status Flush(size_t index);
  absl::Status Fail(absl::Status status);

  const std::string path_;
  const std::string temp_path_;
  ScopedFd fd_;
  const std::vector<TensorInfo> layout_;
  const uint64_t data_bytes_;
  const size_t buffer_bytes_;
  std::map<std::string, size_t, std::less<>> index_by_name_;
  std::vector<TensorState> states_;
  bool finished_ = false;
  absl::Status error_;  // The first I/O error, if any.
};

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_SAFETENSORS_WRITER_H_
