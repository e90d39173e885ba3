#include "checkpoint/safetensors_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mneme::checkpoint {

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Create(
    const std::string& path, const SafetensorsReaderOptions& options) {
  absl::StatusOr<ScopedFd> fd = OpenForRead(path);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<uint64_t> file_size = FileSize(fd->get(), path);
  if (!file_size.ok()) return file_size.status();

  uint8_t prefix[kSafetensorsLengthBytes] = {};
  const size_t prefix_size = *file_size < kSafetensorsLengthBytes
                                 ? static_cast<size_t>(*file_size)
                                 : kSafetensorsLengthBytes;
  absl::Status status =
      PreadFully(fd->get(), 0, absl::MakeSpan(prefix, prefix_size), path);
  if (!status.ok()) return status;
  absl::StatusOr<uint64_t> length = ParseSafetensorsHeaderLength(
      absl::string_view(reinterpret_cast<const char*>(prefix), prefix_size),
      *file_size, path, options.parse);
  if (!length.ok()) return length.status();

  std::string header_json(static_cast<size_t>(*length), '\0');
  status =
      PreadFully(fd->get(), kSafetensorsLengthBytes,
                 absl::MakeSpan(reinterpret_cast<uint8_t*>(header_json.data()),
                                header_json.size()),
                 path);
  if (!status.ok()) return status;
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeaderJson(header_json, *file_size, path);
  if (!header.ok()) return header.status();
  return std::unique_ptr<SafetensorsReader>(
      new SafetensorsReader(path, *std::move(fd), *std::move(header)));
}

absl::StatusOr<const TensorInfo*> SafetensorsReader::Find(
    absl::string_view name) const {
  const TensorInfo* info = header_.Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("safetensors file '", path_,
                                            "' has no tensor ",
                                            QuoteTensorName(name)));
  }
  return info;
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsReader::ReadTensor(
    absl::string_view name) const {
  absl::StatusOr<const TensorInfo*> info = Find(name);
  if (!info.ok()) return info.status();
  std::vector<uint8_t> bytes(static_cast<size_t>((*info)->byte_length));
  absl::Status status =
      PreadFully(fd_.get(), (*info)->offset, absl::MakeSpan(bytes), path_);
  if (!status.ok()) return status;
  return bytes;
}

absl::Status SafetensorsReader::ReadTensorRange(absl::string_view name,
                                                uint64_t offset_in_tensor,
                                                absl::Span<uint8_t> out) const {
  absl::StatusOr<const TensorInfo*> info = Find(name);
  if (!info.ok()) return info.status();
  const uint64_t length = (*info)->byte_length;
  if (offset_in_tensor > length || out.size() > length - offset_in_tensor) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path_, "', tensor ",
                     QuoteTensorName(name), ": range [", offset_in_tensor,
                     ", +", out.size(), ") is outside its ", length, " bytes"));
  }
  return PreadFully(fd_.get(), (*info)->offset + offset_in_tensor, out, path_);
}

absl::Status SafetensorsReader::ReadAt(uint64_t file_offset,
                                       absl::Span<uint8_t> out) const {
  if (file_offset > header_.file_size ||
      out.size() > header_.file_size - file_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors file '", path_, "': range [", file_offset, ", +",
        out.size(), ") is outside its ", header_.file_size, " bytes"));
  }
  return PreadFully(fd_.get(), file_offset, out, path_);
}

}  // namespace mneme::checkpoint
