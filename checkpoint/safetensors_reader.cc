#include "checkpoint/safetensors_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::checkpoint {
namespace {

// Whether `size` bytes at `offset` lie inside `length` bytes (overflow-safe).
bool RangeInside(uint64_t offset, uint64_t size, uint64_t length) {
  return offset <= length && size <= length - offset;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Create(
    const std::string& path, const SafetensorsReaderOptions& options) {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  ASSIGN_OR_RETURN(const uint64_t file_size, FileSize(fd.get(), path));

  uint8_t prefix[kSafetensorsLengthBytes] = {};
  const size_t prefix_size = file_size < kSafetensorsLengthBytes
                                 ? static_cast<size_t>(file_size)
                                 : kSafetensorsLengthBytes;
  RETURN_IF_ERROR(
      PreadFully(fd.get(), 0, absl::MakeSpan(prefix, prefix_size), path));
  ASSIGN_OR_RETURN(
      const uint64_t length,
      ParseSafetensorsHeaderLength(
          absl::string_view(reinterpret_cast<const char*>(prefix), prefix_size),
          file_size, path, options.parse));

  std::string header_json(static_cast<size_t>(length), '\0');
  RETURN_IF_ERROR(
      PreadFully(fd.get(), kSafetensorsLengthBytes,
                 absl::MakeSpan(reinterpret_cast<uint8_t*>(header_json.data()),
                                header_json.size()),
                 path));
  ASSIGN_OR_RETURN(SafetensorsHeader header,
                   ParseSafetensorsHeaderJson(header_json, file_size, path));
  return std::unique_ptr<SafetensorsReader>(
      new SafetensorsReader(path, std::move(fd), std::move(header)));
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
  ASSIGN_OR_RETURN(const TensorInfo* info, Find(name));
  std::vector<uint8_t> bytes(static_cast<size_t>(info->byte_length));
  RETURN_IF_ERROR(
      PreadFully(fd_.get(), info->offset, absl::MakeSpan(bytes), path_));
  return bytes;
}

absl::Status SafetensorsReader::ReadTensorRange(absl::string_view name,
                                                uint64_t offset_in_tensor,
                                                absl::Span<uint8_t> out) const {
  return ReadInTensor(name, offset_in_tensor, out,
                      absl::StatusCode::kInvalidArgument);
}

absl::Status SafetensorsReader::ReadAt(uint64_t file_offset,
                                       absl::Span<uint8_t> out) const {
  if (!RangeInside(file_offset, out.size(), header_.file_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors file '", path_, "': range [", file_offset, ", +",
        out.size(), ") is outside its ", header_.file_size, " bytes"));
  }
  return PreadFully(fd_.get(), file_offset, out, path_);
}

std::vector<std::string> SafetensorsReader::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(header_.tensors.size());
  for (const TensorInfo& info : header_.tensors) names.push_back(info.name);
  return names;
}

absl::StatusOr<TensorSpec> SafetensorsReader::GetTensorSpec(
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const TensorInfo* info, Find(name));
  return ToTensorSpec(*info);
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsReader::ReadTensorBytes(
    absl::string_view name) const {
  return ReadTensor(name);
}

absl::Status SafetensorsReader::ReadTensorByteRange(
    absl::string_view name, uint64_t offset, absl::Span<uint8_t> out) const {
  return ReadInTensor(name, offset, out, absl::StatusCode::kOutOfRange);
}

absl::Status SafetensorsReader::ReadInTensor(absl::string_view name,
                                             uint64_t offset,
                                             absl::Span<uint8_t> out,
                                             absl::StatusCode bad_range) const {
  ASSIGN_OR_RETURN(const TensorInfo* info, Find(name));
  if (!RangeInside(offset, out.size(), info->byte_length)) {
    return absl::Status(bad_range,
                        absl::StrCat("safetensors file '", path_, "', tensor ",
                                     QuoteTensorName(name), ": range [", offset,
                                     ", +", out.size(), ") is outside its ",
                                     info->byte_length, " bytes"));
  }
  return PreadFully(fd_.get(), info->offset + offset, out, path_);
}

}  // namespace mneme::checkpoint
