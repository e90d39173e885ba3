#ifndef MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_H_
#define MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/file_io.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/local_copy/local_copy_manifest.h"
#include "engram_store/local_copy/range_checksum.h"

namespace mneme::engram {

// Reads and parses `dir`/manifest.json. NotFound (saying the copy is missing
// or unfinished) when the directory or the manifest does not exist; DataLoss
// or FailedPrecondition as ParseManifest().
absl::StatusOr<LocalCopyManifest> ReadLocalCopyManifest(const std::string& dir);

struct LocalCopyOpenOptions {
  // Re-read every range at Open() and compare its CRC-32C with the manifest.
  // This reads the whole copy (~47 GB per node for V4.1 at TP4), so it is for
  // tools and suspicion, not for every start. Default: false.
  bool verify_checksums = false;
  // Page cache use of that verification. Default: kRelease.
  PageCachePolicy verify_page_cache = PageCachePolicy::kRelease;
};

// A sparse local copy made by Localize() (local_copy_writer.h), opened for a
// store: which rows of which layer it holds and where. The store reads a
// covered row at Locate()'s offset of the layer's data file (local NVMe) and
// every other row from the source checkpoint.
//
// Open() validates the copy against the store's own view - the source
// checkpoint as it is now and the store's tensor-parallel target - so a copy
// of other rows (another rank's: the field bug where ranks served rank 0's
// rows) or of an older checkpoint is refused rather than served.
//
// Immutable after Open(); thread-safe. Owns one read-only descriptor per
// layer's data file, open while the object lives.
class LocalCopy {
 public:
  // Opens the copy in `dir` for `target` of `source`.
  // NotFound: no directory, no manifest (an unfinished copy has none) or a
  // missing data file. DataLoss: a corrupt manifest, a data file whose size
  // differs from the manifest, or (with verify_checksums) a range whose
  // checksum differs, naming the layer, rows and file. FailedPrecondition:
  // the copy was made from another checkpoint (or the checkpoint's shards
  // changed since), holds another target (tp, ranks, split), or covers other
  // rows; the message names the difference. InvalidArgument for an invalid
  // target.
  static absl::StatusOr<std::unique_ptr<LocalCopy>> Open(
      const std::string& dir, const EngramCheckpoint& source,
      const LocalCopyTarget& target, const LocalCopyOpenOptions& options = {});

  LocalCopy(const LocalCopy&) = delete;
  LocalCopy& operator=(const LocalCopy&) = delete;

  const std::string& dir() const { return dir_; }
  const LocalCopyManifest& manifest() const { return manifest_; }

  // The byte offset of row `row` of layer `layer` in that layer's data file,
  // or nullopt when the copy does not hold the row (or has no such layer).
  // O(log ranges).
  std::optional<uint64_t> Locate(int layer, int64_t row) const;

  // The manifest entry of `layer`; nullptr if the copy has no such layer.
  const LocalCopyLayer* Layer(int layer) const;
  // Path of `layer`'s data file; NotFound if the copy has no such layer.
  absl::StatusOr<std::string> DataPath(int layer) const;
  // The open read-only descriptor of `layer`'s data file (owned by this
  // object; valid while it lives); -1 if the copy has no such layer.
  int DataFd(int layer) const;

  // Reads rows `ids` of `layer` from the copy into `out` (ids.size() *
  // row_bytes, each row its weight bytes then its scale bytes, as
  // EngramCheckpoint::ReadRawRows()). One pread per row: a reference path,
  // not the store's fast one. OutOfRange naming the row when the copy does
  // not hold it; InvalidArgument for an unknown layer or a wrong output size;
  // DataLoss if the data file became shorter.
  absl::Status ReadRawRows(int layer, absl::Span<const int64_t> ids,
                           absl::Span<uint8_t> out) const;

  // Re-reads every range and compares its CRC-32C with the manifest.
  // DataLoss naming the first bad range (layer, rows, file).
  absl::Status VerifyChecksums(PageCachePolicy page_cache) const;

 private:
  struct LayerFile {
    const LocalCopyLayer* layer = nullptr;  // points into manifest_
    std::string path;
    ScopedFd fd;
  };

  LocalCopy() = default;
  const LayerFile* FindFile(int layer) const;

  std::string dir_;
  LocalCopyManifest manifest_;
  std::vector<LayerFile> files_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_H_
