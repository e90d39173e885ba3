#ifndef MNEME_CHECKPOINT_SAFETENSORS_READER_H_
#define MNEME_CHECKPOINT_SAFETENSORS_READER_H_

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
#include "checkpoint/tensor_source.h"
#include "common/file_io.h"

namespace mneme::checkpoint {

struct SafetensorsReaderOptions {
  // Header parsing limits. Default: see SafetensorsParseOptions (100 MiB cap).
  SafetensorsParseOptions parse;
};

// The TensorSpec of a safetensors tensor.
inline TensorSpec ToTensorSpec(const TensorInfo& info) {
  return TensorSpec{info.dtype, info.shape, info.byte_length};
}

// An open safetensors file: its validated header and a descriptor to pread
// tensor bytes with. Nothing is mapped or read beyond the header at Create();
// callers read whole tensors, byte ranges of a tensor, or raw file ranges
// (the Engram store preads individual rows at TensorInfo::offset +
// row * row_bytes).
//
// Also a TensorSource over the file's tensors (see tensor_source.h), whose
// error codes differ from the older ReadTensorRange() only in the range
// check (OutOfRange there, InvalidArgument here).
//
// Thread-safe: immutable after Create(); every read is a pread.
class SafetensorsReader final : public TensorSource {
 public:
  // Opens `path`, reads the 8-byte length and the JSON header, validates them
  // (see safetensors_header.h). NotFound if the file does not exist, DataLoss
  // for a corrupt file, errno-derived codes for other I/O failures; messages
  // name the file (and the tensor).
  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Create(
      const std::string& path, const SafetensorsReaderOptions& options = {});

  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // Every tensor, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const {
    return header_.metadata;
  }
  uint64_t file_size() const { return header_.file_size; }
  // The open descriptor (owned by this reader), for callers that issue their
  // own preads or io_uring reads. Valid for the reader's lifetime.
  int fd() const { return fd_.get(); }

  // The tensor called `name`; nullptr if absent.
  const TensorInfo* FindOrNull(absl::string_view name) const {
    return header_.Find(name);
  }
  // The tensor called `name`; NotFound (naming file and tensor) if absent.
  absl::StatusOr<const TensorInfo*> Find(absl::string_view name) const;

  // All bytes of tensor `name`. NotFound if absent; DataLoss if the file
  // became shorter since Create().
  absl::StatusOr<std::vector<uint8_t>> ReadTensor(absl::string_view name) const;

  // out.size() bytes of tensor `name` starting `offset_in_tensor` bytes into
  // it. NotFound if absent; InvalidArgument if the range is not inside the
  // tensor; DataLoss if the file became shorter since Create().
  absl::Status ReadTensorRange(absl::string_view name,
                               uint64_t offset_in_tensor,
                               absl::Span<uint8_t> out) const;

  // out.size() bytes at absolute file offset `file_offset`. InvalidArgument
  // if the range is not inside the file.
  absl::Status ReadAt(uint64_t file_offset, absl::Span<uint8_t> out) const;

  // TensorSource.
  std::vector<std::string> TensorNames() const override;
  absl::StatusOr<TensorSpec> GetTensorSpec(
      absl::string_view name) const override;
  absl::StatusOr<std::vector<uint8_t>> ReadTensorBytes(
      absl::string_view name) const override;
  absl::Status ReadTensorByteRange(absl::string_view name, uint64_t offset,
                                   absl::Span<uint8_t> out) const override;

 private:
  // out.size() bytes at `offset` into tensor `name`; a range outside the
  // tensor is an error with code `bad_range`.
  absl::Status ReadInTensor(absl::string_view name, uint64_t offset,
                            absl::Span<uint8_t> out,
                            absl::StatusCode bad_range) const;

  SafetensorsReader(std::string path, ScopedFd fd, SafetensorsHeader header)
      : path_(std::move(path)),
        fd_(std::move(fd)),
        header_(std::move(header)) {}

  const std::string path_;
  const ScopedFd fd_;
  const SafetensorsHeader header_;
};

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_SAFETENSORS_READER_H_
