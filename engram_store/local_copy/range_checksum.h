#ifndef MNEME_ENGRAM_STORE_LOCAL_COPY_RANGE_CHECKSUM_H_
#define MNEME_ENGRAM_STORE_LOCAL_COPY_RANGE_CHECKSUM_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mneme::engram {

// Whether to drop a file range from the page cache once it has been read or
// written (posix_fadvise POSIX_FADV_DONTNEED). Copying or verifying a ~47 GB
// table otherwise fills the page cache, which on unified-memory machines
// takes memory from the processes that serve (ENGRAM.md, "Serving facts").
enum class PageCachePolicy {
  kUnspecified = 0,
  // Leave the pages to the kernel.
  kKeep = 1,
  // Drop the range after use (clean pages only: writers sync first).
  kRelease = 2,
};

// The CRC-32C of bytes [offset, offset + length) of the open file `fd`
// (named `path` in messages), read sequentially into `buffer` (any non-empty
// size; larger means fewer syscalls). DataLoss if the file ends first;
// errno-derived codes for I/O errors; InvalidArgument for an empty buffer.
// Thread-safe for distinct buffers.
absl::StatusOr<uint32_t> Crc32cOfFileRange(int fd, uint64_t offset,
                                           uint64_t length,
                                           absl::string_view path,
                                           absl::Span<uint8_t> buffer,
                                           PageCachePolicy page_cache);

// posix_fadvise(POSIX_FADV_DONTNEED) on the range when `page_cache` is
// kRelease; advice only, so failures are ignored.
void MaybeReleasePages(int fd, uint64_t offset, uint64_t length,
                       PageCachePolicy page_cache);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_LOCAL_COPY_RANGE_CHECKSUM_H_
