#ifndef MNEME_TOOLS_QUANT_SHARD_FILE_WRITER_H_
#define MNEME_TOOLS_QUANT_SHARD_FILE_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "common/file_io.h"

namespace mneme::quant {

// How ShardFileWriter::Create treats the file.
enum class ShardOpenMode {
  // Create (or truncate) the file and write its header.
  kCreate = 0,
  // Reopen a file an earlier kCreate with the same declarations started,
  // to continue writing it after an interruption.
  kReopen = 1,
};

// A safetensors file whose tensors are declared up front and whose bytes
// are then written at any offset, in any order, from any thread: the output
// shards of the quantization tools, which fill a table step by step and must
// be able to continue a half-written file after an interruption (the
// streaming SafetensorsWriter writes to a temporary name and cannot). The
// file is written under its final name, so it belongs in a directory that
// is itself renamed into place when complete (output_dir.h).
//
// Layout: tensors contiguous in declaration order after the header that
// checkpoint::EncodeSafetensorsHeader() builds (the same bytes
// SafetensorsWriter writes for the same declarations). kCreate
// reserves the whole file up front (fallocate where the filesystem supports
// it, so a full disk fails at once; else a sparse ftruncate).
//
// Thread-safe: Write() and CopyTensor() may run concurrently on disjoint
// ranges; Sync() and Close() must not overlap them.
class ShardFileWriter {
 public:
  // InvalidArgument for bad declarations (EncodeSafetensorsHeader's checks,
  // messages starting "shard '<path>'"); DataLoss
  // with kReopen if the existing file's header or size differ from the
  // declarations; errno-derived codes for I/O failures (ResourceExhausted
  // for a full disk).
  static absl::StatusOr<std::unique_ptr<ShardFileWriter>> Create(
      const std::string& path, std::vector<checkpoint::TensorDecl> tensors,
      const std::map<std::string, std::string>& metadata, ShardOpenMode mode);

  ShardFileWriter(const ShardFileWriter&) = delete;
  ShardFileWriter& operator=(const ShardFileWriter&) = delete;

  const std::string& path() const { return path_; }
  // Each tensor with its absolute offset, in declaration order.
  const std::vector<checkpoint::TensorInfo>& layout() const { return layout_; }
  // Sum of the tensors' byte lengths.
  uint64_t data_bytes() const { return data_bytes_; }
  // Size of the complete file.
  uint64_t file_size() const { return file_size_; }

  // The declared tensor `name`; NotFound if undeclared.
  absl::StatusOr<const checkpoint::TensorInfo*> Find(
      absl::string_view name) const;

  // Writes `bytes` at `offset_in_tensor` of tensor `name`. NotFound for an
  // undeclared tensor; InvalidArgument if the range leaves the tensor;
  // errno-derived codes (ResourceExhausted for ENOSPC) otherwise.
  absl::Status Write(absl::string_view name, uint64_t offset_in_tensor,
                     absl::Span<const uint8_t> bytes) const;

  // Copies all bytes of tensor `source_name` of `source` into tensor `name`
  // (same byte length, else InvalidArgument), 16 MiB at a time.
  absl::Status CopyTensor(const checkpoint::SafetensorsReader& source,
                          absl::string_view source_name,
                          absl::string_view name) const;

  // Makes everything written so far durable (fdatasync).
  absl::Status Sync();

  // fsyncs and closes the file. Further calls fail with FailedPrecondition.
  absl::Status Close();

 private:
  ShardFileWriter(std::string path, mneme::ScopedFd fd,
                  std::vector<checkpoint::TensorInfo> layout,
                  uint64_t data_bytes, uint64_t file_size)
      : path_(std::move(path)),
        fd_(std::move(fd)),
        layout_(std::move(layout)),
        data_bytes_(data_bytes),
        file_size_(file_size) {}

  const std::string path_;
  mneme::ScopedFd fd_;
  const std::vector<checkpoint::TensorInfo> layout_;
  const uint64_t data_bytes_;
  const uint64_t file_size_;
};

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_SHARD_FILE_WRITER_H_
