#ifndef MNEME_TOOLS_QUANT_OUTPUT_DIR_H_
#define MNEME_TOOLS_QUANT_OUTPUT_DIR_H_

#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::quant {

// Name of the journal inside a partial output directory.
inline constexpr absl::string_view kJournalFileName = ".mneme-journal.json";

// Checks the source and output directories of a checkpoint tool before
// anything is written. InvalidArgument if either is empty, the source is not
// a directory (NotFound if it does not exist), or the output is the source
// or lies inside it (the source must stay untouched); FailedPrecondition if
// the output already exists.
absl::Status CheckOutputPaths(const std::string& source_dir,
                              const std::string& out_dir);

// What identifies the files of a source directory for a resume: name, size
// and modification time of every regular file at its top level, sorted.
nlohmann::json SourceFingerprint(const std::string& source_dir);

struct OutputDirOptions {
  // The checkpoint the output is derived from. Required.
  std::string source_dir;
  // Where the finished output appears. Required.
  std::string out_dir;
  // Which tool writes it, e.g. "quantize-engram". Required.
  std::string tool;
  // Everything that must be equal for a later run to continue this one
  // (options, SourceFingerprint()). Default: null.
  nlohmann::json identity;
};

// The output directory of a checkpoint tool, built under OUT.partial and
// renamed to OUT only when complete, so a directory named OUT is never
// half-written. A journal inside OUT.partial (kJournalFileName) records the
// tool, its identity and the tool's progress state; an interrupted run
// (crash, kill, full disk) leaves OUT.partial with its journal, and a later
// Open() with the same tool and identity resumes from the saved state.
//
// Call order: Open() -> write files (PathOf, WriteFile), SaveState() as
// work becomes durable -> LinkSourceFiles() -> Commit().
// Not thread-safe.
class PartialOutputDir {
 public:
  // Runs CheckOutputPaths(), then creates OUT.partial (and missing parent
  // directories) with a fresh journal, or resumes an existing OUT.partial
  // whose journal has the same tool and identity. FailedPrecondition
  // (naming OUT.partial and saying how to proceed) if OUT.partial exists
  // without a journal or with another tool or identity; errno-derived codes
  // for I/O failures.
  static absl::StatusOr<std::unique_ptr<PartialOutputDir>> Open(
      const OutputDirOptions& options);

  PartialOutputDir(const PartialOutputDir&) = delete;
  PartialOutputDir& operator=(const PartialOutputDir&) = delete;

  // OUT.partial.
  const std::string& path() const { return path_; }
  // OUT.
  const std::string& final_path() const { return final_path_; }
  // Whether Open() continued an earlier run.
  bool resumed() const { return resumed_; }
  // The state saved by the last SaveState() (an empty object when fresh).
  const nlohmann::json& state() const { return state_; }

  // `relative` inside OUT.partial.
  std::string PathOf(absl::string_view relative) const;

  // Records `state` in the journal atomically (temporary file + rename).
  absl::Status SaveState(nlohmann::json state);

  // Writes `contents` to `relative` atomically.
  absl::Status WriteFile(absl::string_view relative,
                         absl::string_view contents) const;

  // Mirrors every file of the source directory (recursively) that is not
  // in `skip` (relative paths) and not yet present: a hard link, or an
  // absolute symbolic link where hard links are impossible (another
  // filesystem); symbolic links are recreated pointing at their resolved
  // targets. Files written by the tool must be in `skip`: the tool never
  // writes through a link into the source.
  absl::Status LinkSourceFiles(const std::set<std::string>& skip) const;

  // Deletes the journal, syncs, and renames OUT.partial to OUT.
  // FailedPrecondition if OUT appeared meanwhile; errno-derived codes
  // otherwise. After it, the object must not be used.
  absl::Status Commit();

 private:
  PartialOutputDir() = default;
  absl::Status WriteJournal() const;

  std::string source_dir_;
  std::string path_;
  std::string final_path_;
  std::string tool_;
  nlohmann::json identity_;
  nlohmann::json state_ = nlohmann::json::object();
  bool resumed_ = false;
};

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_OUTPUT_DIR_H_
