#include "tools/quant/output_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxJournalBytes = uint64_t{64} << 20;

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

absl::Status ErrorCodeStatus(const std::error_code& ec, absl::string_view what,
                             absl::string_view path) {
  return absl::ErrnoToStatus(ec.value(), absl::StrCat(what, " '", path, "'"));
}

// Whether `path` is `root` or lies below it (both normalized absolute).
bool IsWithin(const fs::path& path, const fs::path& root) {
  auto o = root.begin();
  auto i = path.begin();
  for (; o != root.end(); ++o, ++i) {
    if (o->empty()) continue;  // Trailing separator.
    if (i == path.end() || *i != *o) return false;
  }
  return true;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open '", dir, "'"));
  }
  mneme::ScopedFd scoped(fd);
  if (::fsync(fd) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fsync '", dir, "'"));
  }
  return absl::OkStatus();
}

std::string DumpJson(const nlohmann::json& json) {
  return json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace

absl::Status CheckOutputPaths(const std::string& source_dir,
                              const std::string& out_dir) {
  if (source_dir.empty()) {
    return absl::InvalidArgumentError("--checkpoint is required");
  }
  if (out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  std::error_code ec;
  const fs::file_status status = fs::status(source_dir, ec);
  if (!fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory '", source_dir, "' does not exist"));
  }
  if (!fs::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", source_dir, "' is not a directory"));
  }
  const fs::path source = fs::weakly_canonical(source_dir, ec);
  if (ec) return ErrorCodeStatus(ec, "cannot resolve", source_dir);
  const fs::path out = fs::weakly_canonical(StripTrailingSlashes(out_dir), ec);
  if (ec) return ErrorCodeStatus(ec, "cannot resolve", out_dir);
  if (out == source || IsWithin(out, source)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out='", out_dir,
                     "' is the source checkpoint or inside it; the "
                     "source must stay untouched, choose another directory"));
  }
  if (fs::exists(fs::symlink_status(out_dir, ec))) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out='", out_dir,
                     "' already exists; refusing to overwrite it (remove it "
                     "or choose another directory)"));
  }
  return absl::OkStatus();
}

nlohmann::json SourceFingerprint(const std::string& source_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(source_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  nlohmann::json files = nlohmann::json::array();
  for (const std::string& name : names) {
    struct stat st;
    if (::stat(absl::StrCat(source_dir, "/", name).c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode)) {
      continue;
    }
    files.push_back(
        {{"name", name},
         {"size", static_cast<uint64_t>(st.st_size)},
         {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                          st.st_mtim.tv_nsec}});
  }
  return files;
}

absl::StatusOr<std::unique_ptr<PartialOutputDir>> PartialOutputDir::Open(
    const OutputDirOptions& options) {
  RETURN_IF_ERROR(CheckOutputPaths(options.source_dir, options.out_dir));
  auto dir = std::unique_ptr<PartialOutputDir>(new PartialOutputDir());
  dir->source_dir_ = options.source_dir;
  dir->final_path_ = StripTrailingSlashes(options.out_dir);
  dir->path_ = dir->final_path_ + ".partial";
  dir->tool_ = options.tool;
  dir->identity_ = options.identity;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir->path_, ec))) {
    const std::string journal_path = dir->PathOf(std::string(kJournalFileName));
    absl::StatusOr<std::string> text =
        mneme::ReadSmallFile(journal_path, kMaxJournalBytes);
    const nlohmann::json journal =
        text.ok() ? ParseJson(*text).value : nlohmann::json();
    if (!text.ok() || !journal.is_object()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", dir->path_,
          "' exists but holds no readable journal of an interrupted run; "
          "remove it to start over"));
    }
    const auto tool = journal.find("tool");
    const auto identity = journal.find("identity");
    if (tool == journal.end() || *tool != options.tool ||
        identity == journal.end() || *identity != options.identity) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", dir->path_,
          "' holds an interrupted run with another source or other options; "
          "rerun with the same ones to resume it, or remove it to start over"));
    }
    const auto state = journal.find("state");
    if (state != journal.end() && state->is_object()) dir->state_ = *state;
    dir->resumed_ = true;
    return dir;
  }
  fs::create_directories(dir->path_, ec);
  if (ec) return ErrorCodeStatus(ec, "cannot create", dir->path_);
  RETURN_IF_ERROR(dir->WriteJournal());
  return dir;
}

std::string PartialOutputDir::PathOf(absl::string_view relative) const {
  return absl::StrCat(path_, "/", relative);
}

absl::Status PartialOutputDir::WriteJournal() const {
  const nlohmann::json journal = {
      {"tool", tool_}, {"identity", identity_}, {"state", state_}};
  return mneme::WriteFileAtomically(PathOf(kJournalFileName),
                                    DumpJson(journal));
}

absl::Status PartialOutputDir::SaveState(nlohmann::json state) {
  state_ = std::move(state);
  return WriteJournal();
}

absl::Status PartialOutputDir::WriteFile(absl::string_view relative,
                                         absl::string_view contents) const {
  return mneme::WriteFileAtomically(PathOf(relative), contents);
}

absl::Status PartialOutputDir::LinkSourceFiles(
    const std::set<std::string>& skip) const {
  std::error_code ec;
  const fs::path source = fs::absolute(source_dir_, ec);
  if (ec) return ErrorCodeStatus(ec, "cannot resolve", source_dir_);
  fs::recursive_directory_iterator it(source, ec);
  if (ec) return ErrorCodeStatus(ec, "cannot list", source_dir_);
  for (const fs::recursive_directory_iterator end; it != end;) {
    const fs::path from = it->path();
    const std::string relative = from.lexically_relative(source).string();
    const fs::path to = fs::path(path_) / relative;
    const fs::file_status status = it->symlink_status(ec);
    if (ec) return ErrorCodeStatus(ec, "cannot stat", from.string());
    if (skip.count(relative) != 0) {
      if (fs::is_directory(status)) it.disable_recursion_pending();
    } else if (fs::exists(fs::symlink_status(to, ec))) {
      // Linked by an earlier, interrupted run.
    } else if (fs::is_symlink(status)) {
      fs::path target = fs::canonical(from, ec);
      if (ec) target = fs::read_symlink(from, ec);  // Dangling: as it is.
      if (ec) return ErrorCodeStatus(ec, "cannot read link", from.string());
      fs::create_symlink(target, to, ec);
      if (ec) return ErrorCodeStatus(ec, "cannot create link", to.string());
    } else if (fs::is_directory(status)) {
      fs::create_directory(to, ec);
      if (ec) return ErrorCodeStatus(ec, "cannot create", to.string());
    } else if (fs::is_regular_file(status)) {
      if (::link(from.c_str(), to.c_str()) != 0) {
        const int error = errno;
        if (error != EXDEV && error != EPERM && error != EMLINK) {
          return absl::ErrnoToStatus(
              error, absl::StrCat("cannot link '", to.string(), "' to '",
                                  from.string(), "'"));
        }
        fs::create_symlink(from, to, ec);
        if (ec) return ErrorCodeStatus(ec, "cannot create link", to.string());
      }
    }
    it.increment(ec);
    if (ec) return ErrorCodeStatus(ec, "cannot list", source_dir_);
  }
  return absl::OkStatus();
}

absl::Status PartialOutputDir::Commit() {
  if (::unlink(PathOf(kJournalFileName).c_str()) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot remove the journal of '", path_, "'"));
  }
  RETURN_IF_ERROR(SyncDirectory(path_));
  std::error_code ec;
  if (fs::exists(fs::symlink_status(final_path_, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", final_path_, "' appeared while '", path_, "' was written"));
  }
  if (::rename(path_.c_str(), final_path_.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename '", path_,
                                                   "' to '", final_path_, "'"));
  }
  const std::string parent = fs::path(final_path_).parent_path().string();
  return SyncDirectory(parent.empty() ? "." : parent);
}

}  // namespace mneme::quant
