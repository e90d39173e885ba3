#ifndef MNEME_ENGRAM_STORE_IO_URING_ROW_READER_H_
#define MNEME_ENGRAM_STORE_IO_URING_ROW_READER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engram_store/io/read_plan.h"
#include "engram_store/io/read_support.h"
#include "engram_store/io/row_reader.h"

namespace mneme::engram {

struct UringRowReaderOptions {
  // io_uring instances, i.e. Read() calls that can have I/O in flight at
  // once. Further callers wait (until their deadline) for a free ring. Must
  // be >= 1. Default: 4.
  int rings = 4;
  // Submission queue entries per ring: the most reads one Read() keeps in
  // flight. 1..4096. Default: 128.
  int queue_depth = 128;
  // Aligned buffer per ring that reads land in before they are copied out.
  // Extents are admitted, in file order, while they fit; the buffer grows for
  // a single extent longer than this. Must be >= coalesce.max_read_bytes.
  // Default: 4 MiB.
  uint64_t buffer_bytes = 4 << 20;
  // Most io-wq kernel threads per ring (they serve reads the kernel cannot
  // issue asynchronously, e.g. on some network file systems; they show up as
  // "iou-wrk-*" threads of the process). 0 keeps the kernel's limit
  // (min(queue_depth, 4 x CPUs) for file reads). Must be >= 0. Default: 0.
  int max_kernel_workers = 0;
  // Deduplication and coalescing of spans into reads.
  CoalesceOptions coalesce;
};

// RowReader over io_uring (liburing): all reads of a Read() are submitted in
// batches of up to queue_depth and their completions harvested on the
// caller's thread, which resubmits the rest of short reads and copies each
// extent out as soon as it is complete.
//
// Rings: a fixed pool of `rings` rings shared under a mutex; a Read() takes
// one for its duration (a ring per calling thread would grow with the number
// of callers and leave rings of exited threads behind).
//
// Deadlines: on DeadlineExceeded (or an error) the Read() asks the kernel to
// cancel its reads still in flight and returns at once. Those reads write
// only into the ring's own buffer, never into the caller's; the ring goes
// back to the pool owing their completions, and whoever takes it next first
// reaps them (bounded by its own deadline), so the buffer is not reused while
// the kernel may still write to it. No thread is created by the reader.
//
// Thread-safe. Destruction waits for reads still in flight on its rings.
class UringRowReader : public RowReader {
 public:
  // Sets up the rings. InvalidArgument naming the field for bad options;
  // Unavailable (with the reason) if io_uring cannot be used here - kernel
  // without it, disabled by sysctl or a seccomp sandbox - so that the caller
  // can fall back to PreadPoolReader.
  static absl::StatusOr<std::unique_ptr<UringRowReader>> Create(
      const UringRowReaderOptions& options);

  ~UringRowReader() override;

  // See RowReader::Read. DeadlineExceeded also when no ring frees up (or a
  // ring's abandoned reads do not finish) before the deadline.
  absl::Status Read(absl::Span<const ReadSpan> spans,
                    absl::Time deadline) override;

  RowReaderStats GetStats() const override { return counters_.Snapshot(); }

 private:
  struct Ring;

  explicit UringRowReader(const UringRowReaderOptions& options);

  // Takes a free ring, reaping completions it still owes. DeadlineExceeded.
  absl::StatusOr<Ring*> Acquire(absl::Time deadline);
  void Release(Ring* ring);
  absl::Status Execute(Ring& ring, const ReadPlan& plan, absl::Time deadline);

  const UringRowReaderOptions options_;
  ReaderCounters counters_;
  std::vector<std::unique_ptr<Ring>> rings_;

  absl::Mutex mu_;
  std::vector<Ring*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_IO_URING_ROW_READER_H_
