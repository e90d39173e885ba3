#include "engram_store/cache/source_fingerprint.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mneme::engram {

absl::StatusOr<std::string> SourceFingerprint(
    absl::Span<const std::string> paths) {
  if (paths.empty()) {
    return absl::InvalidArgumentError("SourceFingerprint: no paths");
  }
  std::string out;
  for (const std::string& path : paths) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      const std::string message = absl::StrCat(
          "SourceFingerprint: cannot stat ", path, ": ", std::strerror(err));
      if (err == ENOENT || err == ENOTDIR) {
        return absl::NotFoundError(message);
      }
      return absl::UnavailableError(message);
    }
    const int64_t mtime_ns =
        int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    absl::StrAppend(&out, out.empty() ? "" : ";", path, ":",
                    static_cast<int64_t>(st.st_size), ":", mtime_ns);
  }
  return out;
}

}  // namespace mneme::engram
