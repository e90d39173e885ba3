#include "engram_store/local_copy/localize_journal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"

namespace mneme::engram::localize_internal {
namespace {

constexpr uint64_t kMaxJournalBytes = 256ull << 20;

std::optional<std::pair<RangeKey, uint32_t>> ParseJournalEntry(
    absl::string_view line) {
  std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 6 || parts[0] != "range" || parts[5].size() != 8) {
    return std::nullopt;
  }
  int layer = 0;
  int64_t first = 0;
  int64_t count = 0;
  uint64_t offset = 0;
  uint32_t crc = 0;
  if (!absl::SimpleAtoi(parts[1], &layer) ||
      !absl::SimpleAtoi(parts[2], &first) ||
      !absl::SimpleAtoi(parts[3], &count) ||
      !absl::SimpleAtoi(parts[4], &offset) ||
      !absl::SimpleHexAtoi(parts[5], &crc)) {
    return std::nullopt;
  }
  return std::make_pair(RangeKey{layer, first, count, offset}, crc);
}

}  // namespace

absl::Status ErrnoError(int error, absl::string_view what,
                        absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " '", path, "'"));
}

absl::Status MakeDirs(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix =
        slash == std::string::npos ? path : path.substr(0, slash);
    if (!prefix.empty() && prefix.back() != '/' &&
        ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "cannot create directory", prefix);
    }
    if (slash == std::string::npos) break;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return ErrnoError(errno, "cannot stat", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir '", path, "' is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status SyncDir(int dir_fd, absl::string_view path) {
  if (::fsync(dir_fd) != 0 && errno != EINVAL) {
    return ErrnoError(errno, "fsync of directory", path);
  }
  return absl::OkStatus();
}

absl::Status RemoveIfExists(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "cannot remove", path);
  }
  return absl::OkStatus();
}

RangeKey KeyOf(int layer, const LocalCopyRange& range) {
  return {layer, range.first_row, range.count, range.offset};
}

std::string JournalEntryLine(int layer, const LocalCopyRange& range) {
  return absl::StrFormat("range %d %d %d %d %08x\n", layer, range.first_row,
                         range.count, range.offset, range.crc32c);
}

// nullopt when there is no journal.
absl::StatusOr<std::optional<JournalContents>> ReadJournal(
    const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxJournalBytes);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  JournalContents journal;
  std::vector<absl::string_view> lines = absl::StrSplit(*text, '\n');
  // The piece after the last newline is empty or a torn line.
  lines.pop_back();
  if (lines.empty() || !absl::StartsWith(lines[0], kJournalMagic)) {
    return journal;
  }
  absl::string_view header = lines[0];
  header.remove_prefix(std::strlen(kJournalMagic));
  absl::StatusOr<LocalCopyManifest> plan = ParseManifest(header, path);
  if (!plan.ok()) return journal;
  journal.plan = *std::move(plan);
  for (size_t i = 1; i < lines.size(); ++i) {
    if (auto entry = ParseJournalEntry(lines[i])) {
      journal.entries[entry->first] = entry->second;
    }
  }
  return journal;
}

absl::Status AppendAll(int fd, absl::string_view data, absl::string_view path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot append to", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace mneme::engram::localize_internal
