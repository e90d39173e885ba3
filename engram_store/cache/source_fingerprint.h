#ifndef MNEME_ENGRAM_STORE_CACHE_SOURCE_FINGERPRINT_H_
#define MNEME_ENGRAM_STORE_CACHE_SOURCE_FINGERPRINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mneme::engram {

// A string that identifies the current contents of `paths` cheaply: each
// file's path, size and modification time (ns), in the given order. Meant
// for RocksDbRowCacheOptions::source_id (append the table's format and
// layer): replacing or rewriting a checkpoint shard changes it, so a
// persistent cache built from the old files is rebuilt instead of serving
// stale rows. It does not read the files, so an in-place rewrite that keeps
// size and mtime is not noticed. NotFound if a file does not exist,
// Unavailable if it cannot be stat'ed, InvalidArgument for no paths.
absl::StatusOr<std::string> SourceFingerprint(
    absl::Span<const std::string> paths);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_SOURCE_FINGERPRINT_H_
