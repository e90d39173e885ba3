#ifndef MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_WRITER_H_
#define MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/local_copy/local_copy_manifest.h"
#include "engram_store/local_copy/range_checksum.h"

namespace mneme::engram {

// Where a running Localize() stands; passed to LocalizeOptions::on_range_done.
struct LocalizeProgress {
  // Ranges (manifest entries) done, including those already present from an
  // earlier run, and in all.
  int64_t ranges_done = 0;
  int64_t ranges_total = 0;
  // Bytes of the copy done (including those already present) and in all.
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  // Bytes copied by this run.
  uint64_t bytes_copied = 0;
  // Since Localize() was called.
  absl::Duration elapsed;
};

struct LocalizeOptions {
  // The checkpoint directory; used by the Localize() overload that opens it.
  // Required there.
  std::string checkpoint_dir;
  // The copy's directory, created if missing (with its parents); must not be
  // the checkpoint directory. Required.
  std::string out_dir;
  // Which rows to copy. Required (ranks has no default).
  LocalCopyTarget target;
  // Replace whatever copy `out_dir` holds (a complete copy of another source
  // or target, or an unfinished one of another target) instead of refusing.
  // Default: false.
  bool force = false;
  // Ranges copied in parallel, each by one thread with its own buffers.
  // Parallel streams help on NFS. Range [1, 64]. Default: 4.
  int threads = 4;
  // Bytes of raw rows per read/write step (rounded down to whole rows, at
  // least one row); each thread holds about twice this. Range [1, 1 GiB].
  // Default: 8 MiB.
  uint64_t chunk_bytes = 8ull << 20;
  // Largest manifest entry in bytes: the unit of copying, checksumming and
  // resuming (rounded down to whole rows, at least one row). Default: 256 MiB.
  uint64_t max_range_bytes = 256ull << 20;
  // Re-read every range after copying it (from the device: it is synced and,
  // with kRelease, dropped from the page cache first) and compare its
  // CRC-32C with the source bytes'; and re-verify the ranges an earlier run
  // completed before skipping them. Default: true.
  bool verify = true;
  // Page cache use for source reads and copy writes. Default: kRelease.
  PageCachePolicy page_cache = PageCachePolicy::kRelease;
  // Called after each range is copied and journaled (from the copying
  // threads, one call at a time). A non-OK status stops the copy: ranges in
  // flight finish, nothing else starts, and Localize() returns that status,
  // leaving the journal so that a later run resumes. Default: none.
  std::function<absl::Status(const LocalizeProgress&)> on_range_done;
};

// What Localize() did.
struct LocalizeSummary {
  struct Layer {
    int layer = 0;
    formats::RowFormat format = formats::RowFormat::kUnspecified;
    int64_t rows = 0;
    uint64_t bytes = 0;
    int64_t ranges = 0;
  };
  // Per Engram layer, in config order.
  std::vector<Layer> layers;
  // Totals of the copy.
  int64_t rows = 0;
  uint64_t bytes = 0;
  int64_t ranges = 0;
  // Ranges copied by this run, and ranges kept from an earlier run (after
  // verification, when enabled).
  int64_t ranges_copied = 0;
  int64_t ranges_reused = 0;
  uint64_t bytes_copied = 0;
  absl::Duration elapsed;
  // Path of the manifest written (or found complete).
  std::string manifest_path;
};

// Makes (or finishes, or repairs) a sparse local copy of the rows that
// options.target serves, from `source` into options.out_dir: per Engram
// layer a data file of the raw rows of its ranges, then the manifest
// (local_copy_manifest.h) - atomically and last, so a directory without one
// is never used.
//
// Copies stream each range in chunk_bytes steps (a range's rows are
// contiguous in the source tensors; weight and scale bytes are interleaved
// into raw rows). Progress is journaled per range (kLocalCopyJournalFileName,
// with each range's CRC-32C), so an interrupted run resumes: completed ranges
// are re-verified and skipped. Running again on a complete copy of the same
// source and target verifies it, recopies any bad range and otherwise
// changes nothing.
//
// Errors: InvalidArgument naming the field for bad options (out_dir equal to
// the checkpoint directory included); FailedPrecondition when out_dir holds
// a copy of another source or target (or an unfinished copy of another
// target) and force is off, naming the difference; DataLoss when out_dir's
// manifest is corrupt and force is off, or when a copied range reads back
// differently; Unavailable when another Localize() holds out_dir; Aborted
// when the source's shards changed during the copy (run again); the status of
// on_range_done when it stops the copy; I/O errors otherwise.
// Thread-compatible; concurrent runs on one out_dir are refused.
absl::StatusOr<LocalizeSummary> Localize(const EngramCheckpoint& source,
                                         const LocalizeOptions& options);

// Opens options.checkpoint_dir (EngramCheckpoint::Open()) and runs the
// above.
absl::StatusOr<LocalizeSummary> Localize(const LocalizeOptions& options);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_WRITER_H_
