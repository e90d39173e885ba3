#ifndef MNEME_ENGRAM_STORE_LOCAL_COPY_LOCALIZE_JOURNAL_H_
#define MNEME_ENGRAM_STORE_LOCAL_COPY_LOCALIZE_JOURNAL_H_

// Internal to local_copy_writer: the journal of an unfinished localize run
// and the directory helpers the run uses.
//
// The journal: a header line holding the plan (compact manifest JSON), then
// one line per range done. Lines are appended whole; a torn last line (no
// newline) is ignored, and every entry is re-verified before it is trusted.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engram_store/local_copy/local_copy_manifest.h"

namespace mneme::engram::localize_internal {

// The first bytes of the journal's header line.
inline constexpr char kJournalMagic[] = "mneme-localize-journal 1 ";

// The errno status of `what` on `path` ("cannot remove 'path'").
absl::Status ErrnoError(int error, absl::string_view what,
                        absl::string_view path);

// mkdir -p: each prefix of `path` ending before a '/', then `path`.
// InvalidArgument if `path` exists and is not a directory.
absl::Status MakeDirs(const std::string& path);

// fsync of the directory `dir_fd` (EINVAL, for file systems that cannot,
// is ignored).
absl::Status SyncDir(int dir_fd, absl::string_view path);

// unlink(path); a missing file is not an error.
absl::Status RemoveIfExists(const std::string& path);

// (layer, first_row, count, offset): a range of the plan.
using RangeKey = std::tuple<int, int64_t, int64_t, uint64_t>;

RangeKey KeyOf(int layer, const LocalCopyRange& range);

struct JournalContents {
  // nullopt when the header cannot be parsed.
  std::optional<LocalCopyManifest> plan;
  // Completed ranges and their checksums; a later line wins.
  std::map<RangeKey, uint32_t> entries;
};

// The journal line recording that `range` of `layer` is done.
std::string JournalEntryLine(int layer, const LocalCopyRange& range);

// The journal at `path`; nullopt when there is none. A journal whose header
// does not parse has no plan and no entries.
absl::StatusOr<std::optional<JournalContents>> ReadJournal(
    const std::string& path);

// Writes all of `data` at the end of `fd` (opened O_APPEND), retrying short
// writes and EINTR.
absl::Status AppendAll(int fd, absl::string_view data, absl::string_view path);

}  // namespace mneme::engram::localize_internal

#endif  // MNEME_ENGRAM_STORE_LOCAL_COPY_LOCALIZE_JOURNAL_H_
