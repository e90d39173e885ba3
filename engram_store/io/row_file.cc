#include "engram_store/io/row_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mneme::engram {

absl::string_view OpenModeName(OpenMode mode) {
  switch (mode) {
    case OpenMode::kBuffered:
      return "buffered";
    case OpenMode::kDirect:
      return "direct";
    case OpenMode::kNfs:
      return "nfs";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<RowFile>> RowFile::Open(const std::string& path,
                                                       OpenMode mode) {
  if (path.empty()) return absl::InvalidArgumentError("RowFile: empty path");
  int flags = O_RDONLY | O_CLOEXEC;
  if (mode == OpenMode::kDirect) flags |= O_DIRECT;
  int fd;
  do {
    fd = ::open(path.c_str(), flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (mode == OpenMode::kDirect && err == EINVAL) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open '", path,
                       "' with O_DIRECT: its file system does not support it"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open '", path, "'"));
  }
  // From here on `fd` is closed on every error path.
  auto fail = [fd](absl::Status status) {
    ::close(fd);
    return status;
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return fail(
        absl::ErrnoToStatus(errno, absl::StrCat("cannot stat '", path, "'")));
  }
  uint64_t size = 0;
  if (S_ISREG(st.st_mode)) {
    size = static_cast<uint64_t>(st.st_size);
  } else if (S_ISBLK(st.st_mode)) {
    if (::ioctl(fd, BLKGETSIZE64, &size) != 0) {
      return fail(absl::ErrnoToStatus(
          errno, absl::StrCat("cannot get the size of '", path, "'")));
    }
  } else {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is neither a regular file nor a block device")));
  }
  if (mode == OpenMode::kNfs) {
    // Rows are read at random: readahead would only fill the cache with
    // neighbours that are released again right away.
    const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    if (err != 0) {
      return fail(absl::ErrnoToStatus(
          err, absl::StrCat("posix_fadvise(RANDOM) on '", path, "'")));
    }
    // Start from an empty cache: pages cached before (by a copy, a writer or
    // readahead) may sit in large folios, which the per-read release of a few
    // pages cannot split. Advisory, so a failure only leaves them cached.
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  return std::unique_ptr<RowFile>(new RowFile(path, mode, fd, size));
}

RowFile::RowFile(std::string path, OpenMode mode, int fd, uint64_t size)
    : path_(std::move(path)),
      mode_(mode),
      fd_(fd),
      size_(size),
      alignment_(mode == OpenMode::kDirect ? kDirectAlignment : 1) {}

// Close errors of a read-only descriptor carry no information.
RowFile::~RowFile() { ::close(fd_); }

}  // namespace mneme::engram
