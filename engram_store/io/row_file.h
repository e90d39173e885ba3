#ifndef MNEME_ENGRAM_STORE_IO_ROW_FILE_H_
#define MNEME_ENGRAM_STORE_IO_ROW_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::engram {

// How a shard file is opened, i.e. how its reads treat the page cache.
enum class OpenMode {
  // Plain buffered reads through the page cache. Fastest when the table fits
  // in RAM; the cache grows with the bytes touched.
  kBuffered,
  // O_DIRECT: readers fetch whole aligned pages (RowFile::alignment()) into
  // aligned buffers and copy the requested bytes out. No page cache is used,
  // so host memory stays flat however much of the table is read.
  kDirect,
  // For network file systems (and local files whose page cache must stay
  // bounded): buffered reads with POSIX_FADV_RANDOM (no readahead, so each
  // read caches only its own pages, as single pages), and after each read its
  // pages are released with POSIX_FADV_DONTNEED. Open() first drops whatever
  // of the file is cached already: pages cached by other means may sit in
  // large folios, which releasing a page or two cannot split. Readers never
  // run reads of such files inline on the caller's thread, so a hung server
  // cannot hold a caller past its deadline (kBuffered is the mode to use for
  // a local file whose pages may stay cached).
  kNfs,
};

// Returns "buffered", "direct" or "nfs".
absl::string_view OpenModeName(OpenMode mode);

// An opened shard file that rows are read from: the descriptor, its path (for
// error messages), its open mode and its size when opened.
//
// Spans past size() are refused by the readers (OutOfRange); a file that
// shrinks after Open() (truncated under the store) shows up as a short read,
// which the readers report as DataLoss naming path() and the offset.
//
// Immutable after Open(); thread-safe. Readers borrow it: a RowFile must
// outlive every Read() whose spans name it, and also the reader itself when a
// read of it may still be in flight (a read abandoned at its deadline).
class RowFile {
 public:
  // Opens `path` read-only in `mode`. Accepts regular files and block
  // devices. Errors: NotFound / PermissionDenied / ... (from errno) if the
  // open fails; InvalidArgument if `path` is empty or not a regular file or
  // block device; FailedPrecondition for kDirect on a file system without
  // O_DIRECT support (e.g. tmpfs), so a caller can fall back to kBuffered.
  static absl::StatusOr<std::unique_ptr<RowFile>> Open(const std::string& path,
                                                       OpenMode mode);

  RowFile(const RowFile&) = delete;
  RowFile& operator=(const RowFile&) = delete;
  ~RowFile();

  const std::string& path() const { return path_; }
  OpenMode mode() const { return mode_; }
  int fd() const { return fd_; }
  // Size in bytes when opened.
  uint64_t size() const { return size_; }
  // The alignment (bytes) of file offsets, lengths and buffer addresses of
  // every read of this file: kDirectAlignment for kDirect, 1 otherwise.
  uint64_t alignment() const { return alignment_; }

  // Page size assumed by O_DIRECT reads and page release. 4 KiB covers both
  // 512-byte and 4 KiB logical-block devices.
  static constexpr uint64_t kDirectAlignment = 4096;

 private:
  RowFile(std::string path, OpenMode mode, int fd, uint64_t size);

  const std::string path_;
  const OpenMode mode_;
  const int fd_;
  const uint64_t size_;
  const uint64_t alignment_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_IO_ROW_FILE_H_
