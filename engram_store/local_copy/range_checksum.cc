#include "engram_store/local_copy/range_checksum.h"

#include <fcntl.h>

#include <algorithm>

#include "absl/status/status.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "engram_store/local_copy/crc32c.h"

namespace mneme::engram {

absl::StatusOr<uint32_t> Crc32cOfFileRange(int fd, uint64_t offset,
                                           uint64_t length,
                                           absl::string_view path,
                                           absl::Span<uint8_t> buffer,
                                           PageCachePolicy page_cache) {
  if (buffer.empty()) {
    return absl::InvalidArgumentError("Crc32cOfFileRange: empty buffer");
  }
  uint32_t crc = 0;
  for (uint64_t done = 0; done < length;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(buffer.size(), length - done));
    RETURN_IF_ERROR(PreadFully(fd, offset + done, buffer.subspan(0, n), path));
    crc = ExtendCrc32c(crc, buffer.subspan(0, n));
    MaybeReleasePages(fd, offset + done, n, page_cache);
    done += n;
  }
  return crc;
}

void MaybeReleasePages(int fd, uint64_t offset, uint64_t length,
                       PageCachePolicy page_cache) {
  if (page_cache != PageCachePolicy::kRelease || length == 0) return;
  // Advice: a failure only means the pages stay cached.
  (void)::posix_fadvise(fd, static_cast<off_t>(offset),
                        static_cast<off_t>(length), POSIX_FADV_DONTNEED);
}

}  // namespace mneme::engram
