#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme {
namespace {

absl::Status ErrnoStatus(int error, absl::string_view what,
                         absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " '", path, "'"));
}

}  // namespace

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int ScopedFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void ScopedFd::reset() {
  if (fd_ >= 0) {
    // Nothing was written through descriptors closed here (or the writer
    // already reported its own failure), so a close error changes nothing.
    ::close(fd_);
    fd_ = -1;
  }
}

absl::Status ScopedFd::Close(absl::string_view path) {
  if (fd_ < 0) return absl::OkStatus();
  int fd = release();
  if (::close(fd) != 0) return ErrnoStatus(errno, "close", path);
  return absl::OkStatus();
}

absl::StatusOr<ScopedFd> OpenForRead(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  return ScopedFd(fd);
}

absl::StatusOr<uint64_t> FileSize(int fd, absl::string_view path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a regular file"));
  }
  return static_cast<uint64_t>(st.st_size);
}

absl::Status PreadFully(int fd, uint64_t offset, absl::Span<uint8_t> out,
                        absl::string_view path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(
          errno, absl::StrCat("pread at offset ", offset + done, " of"), path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(
          "unexpected end of file '", path, "' at offset ", offset + done,
          " (wanted ", out.size() - done, " more bytes)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PwriteFully(int fd, uint64_t offset,
                         absl::Span<const uint8_t> data,
                         absl::string_view path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                         static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(
          errno, absl::StrCat("pwrite at offset ", offset + done, " of"), path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PathExists(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return ErrnoStatus(errno, "cannot stat", path);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes) {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), path));
  if (size > max_bytes) {
    return absl::DataLossError(absl::StrCat("file '", path, "' is ", size,
                                            " bytes, more than the limit of ",
                                            max_bytes));
  }
  std::string contents(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(
      PreadFully(fd.get(), 0,
                 absl::MakeSpan(reinterpret_cast<uint8_t*>(contents.data()),
                                contents.size()),
                 path));
  return contents;
}

absl::StatusOr<ScopedFd> CreateTempFileNextTo(const std::string& path,
                                              std::string* temp_path) {
  std::string pattern = absl::StrCat(path, ".partial.XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  int fd = ::mkostemp(buffer.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot create a file next to", path);
  ScopedFd scoped(fd);
  *temp_path = buffer.data();
  if (::fchmod(fd, 0644) != 0) {
    absl::Status status = ErrnoStatus(errno, "cannot chmod", *temp_path);
    ::unlink(temp_path->c_str());
    return status;
  }
  return scoped;
}

absl::Status CommitTempFile(ScopedFd fd, const std::string& temp_path,
                            const std::string& path) {
  absl::Status status;
  if (::fsync(fd.get()) != 0) status = ErrnoStatus(errno, "fsync", temp_path);
  absl::Status close_status = fd.Close(temp_path);
  if (status.ok()) status = close_status;
  if (status.ok() && ::rename(temp_path.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(
        errno, absl::StrCat("cannot rename onto '", path, "' the file"),
        temp_path);
  }
  if (!status.ok()) ::unlink(temp_path.c_str());
  return status;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  std::string temp_path;
  ASSIGN_OR_RETURN(ScopedFd fd, CreateTempFileNextTo(path, &temp_path));
  absl::Status status = PwriteFully(
      fd.get(), 0,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(contents.data()),
                          contents.size()),
      temp_path);
  if (!status.ok()) {
    ::unlink(temp_path.c_str());
    return status;
  }
  return CommitTempFile(std::move(fd), temp_path, path);
}

}  // namespace mneme
