#ifndef MNEME_COMMON_FILE_IO_H_
#define MNEME_COMMON_FILE_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mneme {

// Owns a POSIX file descriptor and closes it on destruction. Move-only.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release();
  // Closes the descriptor (if any). Close errors of a read-only descriptor
  // carry no information, so they are ignored here; writers that care call
  // Close().
  void reset();
  // Closes the descriptor and reports a failed close (lost write-back).
  absl::Status Close(absl::string_view path);

 private:
  int fd_ = -1;
};

// Opens `path` read-only (O_CLOEXEC). NotFound if it does not exist; other
// errno-derived codes (e.g. PermissionDenied) otherwise. Messages name path.
absl::StatusOr<ScopedFd> OpenForRead(const std::string& path);

// Size in bytes of the open file `fd` (fstat).
absl::StatusOr<uint64_t> FileSize(int fd, absl::string_view path);

// Reads exactly out.size() bytes at `offset`, retrying short reads and EINTR.
// DataLoss if the file ends first; errno-derived codes for I/O errors.
absl::Status PreadFully(int fd, uint64_t offset, absl::Span<uint8_t> out,
                        absl::string_view path);

// Writes all of `data` at `offset`, retrying short writes and EINTR.
absl::Status PwriteFully(int fd, uint64_t offset,
                         absl::Span<const uint8_t> data,
                         absl::string_view path);

// Whether `path` exists (stat succeeds). Errors other than ENOENT/ENOTDIR
// (e.g. PermissionDenied) are returned.
absl::StatusOr<bool> PathExists(const std::string& path);

// Reads a whole (small) file. NotFound if missing; DataLoss if it is larger
// than `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes);

// Creates a temporary file next to `path` (same directory, so that a rename
// onto `path` is atomic) with mode 0644. Its name is returned in *temp_path.
absl::StatusOr<ScopedFd> CreateTempFileNextTo(const std::string& path,
                                              std::string* temp_path);

// fsyncs and closes `fd` (a file written at `temp_path`), then renames it onto
// `path`: readers see either the old file or the complete new one.
absl::Status CommitTempFile(ScopedFd fd, const std::string& temp_path,
                            const std::string& path);

// Writes `contents` to `path` through a temporary file and a rename.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

}  // namespace mneme

#endif  // MNEME_COMMON_FILE_IO_H_
