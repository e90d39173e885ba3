#include "tools/quant/shard_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::quant {
namespace {

using mneme::ScopedFd;

constexpr uint64_t kCopyChunkBytes = uint64_t{16} << 20;

absl::Status ErrnoError(int error, absl::string_view what,
                        absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " '", path, "'"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardFileWriter>> ShardFileWriter::Create(
    const std::string& path, std::vector<checkpoint::TensorDecl> tensors,
    const std::map<std::string, std::string>& metadata, ShardOpenMode mode) {
  ASSIGN_OR_RETURN(
      checkpoint::EncodedSafetensorsHeader encoded,
      checkpoint::EncodeSafetensorsHeader(std::move(tensors), metadata,
                                          absl::StrCat("shard '", path, "'")));
  const std::string& prefix = encoded.prefix;
  std::vector<checkpoint::TensorInfo>& layout = encoded.layout;
  const uint64_t data_bytes = encoded.data_bytes;
  const uint64_t file_size = prefix.size() + data_bytes;

  if (mode == ShardOpenMode::kReopen) {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoError(errno, "cannot reopen", path);
    ScopedFd scoped(fd);
    ASSIGN_OR_RETURN(uint64_t size, mneme::FileSize(fd, path));
    std::string existing(prefix.size(), '\0');
    absl::Status read =
        size == file_size
            ? mneme::PreadFully(
                  fd, 0,
                  absl::MakeSpan(reinterpret_cast<uint8_t*>(existing.data()),
                                 existing.size()),
                  path)
            : absl::OkStatus();
    if (size != file_size || !read.ok() || existing != prefix) {
      return absl::DataLossError(absl::StrCat(
          "partial shard '", path,
          "' does not match the tensors to be written (size ", size, " vs ",
          file_size, "); remove the partial output to start over"));
    }
    return std::unique_ptr<ShardFileWriter>(new ShardFileWriter(
        path, std::move(scoped), std::move(layout), data_bytes, file_size));
  }

  int fd;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, "cannot create", path);
  ScopedFd scoped(fd);
  if (file_size > 0 &&
      ::fallocate(fd, 0, 0, static_cast<off_t>(file_size)) != 0) {
    const int error = errno;
    if (error != EOPNOTSUPP && error != ENOSYS) {
      return ErrnoError(
          error, absl::StrCat("cannot reserve ", file_size, " bytes for"),
          path);
    }
    if (::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
      return ErrnoError(errno, "cannot size", path);
    }
  }
  RETURN_IF_ERROR(mneme::PwriteFully(
      fd, 0,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(prefix.data()),
                          prefix.size()),
      path));
  return std::unique_ptr<ShardFileWriter>(new ShardFileWriter(
      path, std::move(scoped), std::move(layout), data_bytes, file_size));
}

absl::StatusOr<const checkpoint::TensorInfo*> ShardFileWriter::Find(
    absl::string_view name) const {
  for (const checkpoint::TensorInfo& info : layout_) {
    if (info.name == name) return &info;
  }
  return absl::NotFoundError(absl::StrCat("shard '", path_,
                                          "' declares no tensor ",
                                          checkpoint::QuoteTensorName(name)));
}

absl::Status ShardFileWriter::Write(absl::string_view name,
                                    uint64_t offset_in_tensor,
                                    absl::Span<const uint8_t> bytes) const {
  if (!fd_.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard '", path_, "' is closed"));
  }
  ASSIGN_OR_RETURN(const checkpoint::TensorInfo* info, Find(name));
  if (offset_in_tensor > info->byte_length ||
      bytes.size() > info->byte_length - offset_in_tensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard '", path_, "', tensor ", checkpoint::QuoteTensorName(name),
        ": writing ", bytes.size(), " bytes at ", offset_in_tensor,
        " leaves its ", info->byte_length, " bytes"));
  }
  return mneme::PwriteFully(fd_.get(), info->offset + offset_in_tensor, bytes,
                            path_);
}

absl::Status ShardFileWriter::CopyTensor(
    const checkpoint::SafetensorsReader& source, absl::string_view source_name,
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const checkpoint::TensorInfo* from,
                   source.Find(source_name));
  ASSIGN_OR_RETURN(const checkpoint::TensorInfo* to, Find(name));
  if (from->byte_length != to->byte_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot copy tensor ", checkpoint::QuoteTensorName(source_name), " (",
        from->byte_length, " bytes) into ", checkpoint::QuoteTensorName(name),
        " of '", path_, "' (", to->byte_length, " bytes)"));
  }
  std::vector<uint8_t> buffer(
      static_cast<size_t>(std::min(kCopyChunkBytes, from->byte_length)));
  for (uint64_t done = 0; done < from->byte_length;) {
    const uint64_t n =
        std::min<uint64_t>(buffer.size(), from->byte_length - done);
    absl::Span<uint8_t> chunk(buffer.data(), n);
    RETURN_IF_ERROR(source.ReadTensorRange(source_name, done, chunk));
    RETURN_IF_ERROR(Write(name, done, chunk));
    done += n;
  }
  return absl::OkStatus();
}

absl::Status ShardFileWriter::Sync() {
  if (!fd_.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard '", path_, "' is closed"));
  }
  if (::fdatasync(fd_.get()) != 0) return ErrnoError(errno, "fdatasync", path_);
  return absl::OkStatus();
}

absl::Status ShardFileWriter::Close() {
  if (!fd_.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard '", path_, "' is closed"));
  }
  if (::fsync(fd_.get()) != 0) {
    const int error = errno;
    fd_.reset();
    return ErrnoError(error, "fsync", path_);
  }
  return fd_.Close(path_);
}

}  // namespace mneme::quant
