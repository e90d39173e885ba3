// libFuzzer target for the files of an Engram local copy: the input as a
// manifest (engram::ParseManifest) and as a localize journal
// (localize_internal::ReadJournal), both as it is and behind the journal's
// magic line. A manifest must be refused with a status naming the file or
// round-trip through ManifestToJson; a journal must read as "no plan" or a
// plan - never a crash.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engram_store/local_copy/local_copy_manifest.h"
#include "engram_store/local_copy/localize_journal.h"

namespace {

using ::mneme::engram::LocalCopyManifest;
using ::mneme::engram::ManifestToCompactJson;
using ::mneme::engram::ManifestToJson;
using ::mneme::engram::ParseManifest;

constexpr char kFileName[] = "fuzz/manifest.json";

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

void CheckManifest(absl::string_view text) {
  const absl::StatusOr<LocalCopyManifest> manifest =
      ParseManifest(text, kFileName);
  if (!manifest.ok()) {
    if (manifest.status().message().find(kFileName) ==
        absl::string_view::npos) {
      Fail("refusal does not name the file");
    }
    return;
  }
  const std::string json = ManifestToJson(*manifest);
  const absl::StatusOr<LocalCopyManifest> again = ParseManifest(json, "again");
  if (!again.ok()) Fail("a written manifest does not parse again");
  if (ManifestToJson(*again) != json) Fail("manifest does not round-trip");
  if (ManifestToCompactJson(*again).find('\n') != std::string::npos) {
    Fail("compact manifest spans lines");
  }
}

// A file the journal runs write; reused across inputs.
const std::string& JournalPath() {
  static const std::string* const path = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(dir != nullptr ? dir : "/tmp", "/journal-XXXXXX");
    const int fd = mkstemp(pattern.data());
    if (fd < 0) Fail("mkstemp");
    close(fd);
    return new std::string(pattern);
  }();
  return *path;
}

void CheckJournal(absl::string_view text) {
  const std::string& path = JournalPath();
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0) Fail("cannot open the journal file");
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) Fail("cannot write the journal file");
    done += static_cast<size_t>(n);
  }
  close(fd);
  const absl::StatusOr<
      std::optional<mneme::engram::localize_internal::JournalContents>>
      journal = mneme::engram::localize_internal::ReadJournal(path);
  if (!journal.ok()) Fail("an existing journal could not be read");
  if (!journal->has_value()) Fail("an existing journal reads as absent");
  if (!(*journal)->plan.has_value() && !(*journal)->entries.empty()) {
    Fail("entries without a plan");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  CheckManifest(input);
  CheckJournal(input);
  CheckJournal(
      absl::StrCat(mneme::engram::localize_internal::kJournalMagic, input));
  return 0;
}
