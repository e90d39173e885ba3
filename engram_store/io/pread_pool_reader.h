#ifndef MNEME_ENGRAM_STORE_IO_PREAD_POOL_READER_H_
#define MNEME_ENGRAM_STORE_IO_PREAD_POOL_READER_H_

#include <sys/types.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
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

// The positional read a PreadPoolReader issues; same contract as ::pread.
using PreadFunction =
    std::function<ssize_t(int fd, void* buf, size_t count, off_t offset)>;

struct PreadPoolReaderOptions {
  // Worker threads, started by Create() and kept until the reader is
  // destroyed. Must be >= 1. Default: 16.
  int threads = 16;
  // Most work items waiting for a worker, over all callers. A Read() queues
  // up to `threads` items (each pulls batches of that Read's reads until none
  // are left) and waits, until its deadline, while the queue is full. Must be
  // >= 1. Default: 256.
  int queue_capacity = 256;
  // Most reads (after coalescing) one batch issues. A Read() with fewer than
  // threads x reads_per_task reads is split evenly over the threads, so even
  // a small batch of cold rows is read in parallel. Must be >= 1. Default: 16.
  int reads_per_task = 16;
  // A Read() with fewer non-empty spans than this, all of kBuffered files,
  // runs on the caller's thread without any hand-off (page-cache hits cost
  // less than waking a worker). Reads of kDirect files always use the pool,
  // as they go to the device and gain from parallel reads; so do kNfs ones,
  // as inline reads are serial and cannot be interrupted at the deadline
  // (which is checked only before they start). 0 sends everything to the
  // pool. Must be >= 0. Default: 32.
  int inline_max_spans = 32;
  // Deduplication and coalescing of spans into reads.
  CoalesceOptions coalesce;
  // The read primitive. Default (empty): ::pread. A hook for putting a
  // fault-injecting or instrumented file layer under the pool (in the manner
  // of RocksDB's Env); production code leaves it empty.
  PreadFunction pread;
};

// RowReader over a fixed pool of threads issuing pread(2).
//
// A Read() is planned (deduplicated, coalesced, page-widened for kDirect),
// split into batches of reads, and served by the workers, each reading a
// batch into its own aligned scratch buffer and then copying the batch's
// spans into the callers' buffers. Small requests run inline instead.
//
// Deadlines: the caller waits for its batches until `deadline`, then marks
// the request abandoned and waits only for copies already under way (memcpy,
// never I/O) before returning DeadlineExceeded. A worker stuck in a stalled
// pread keeps its scratch buffer - the only memory the late completion
// touches - and, once the pread returns, finds the request abandoned and
// copies nothing. The other workers keep serving; no thread is ever added.
// The same applies when a batch fails: Read() returns the first error once
// running copies are done.
//
// Thread-safe. Destruction joins the workers, so it waits for reads in
// flight, including stalled ones abandoned at their deadline.
class PreadPoolReader : public RowReader {
 public:
  // Starts the workers. InvalidArgument naming the field for bad options.
  static absl::StatusOr<std::unique_ptr<PreadPoolReader>> Create(
      const PreadPoolReaderOptions& options);

  ~PreadPoolReader() override;

  // See RowReader::Read. DeadlineExceeded also when the work queue stays full
  // until the deadline.
  absl::Status Read(absl::Span<const ReadSpan> spans,
                    absl::Time deadline) override;

  RowReaderStats GetStats() const override { return counters_.Snapshot(); }

 private:
  struct Request;

  explicit PreadPoolReader(const PreadPoolReaderOptions& options);

  void WorkerLoop();
  // Reads and delivers batch `batch` of `request` with `scratch`.
  void RunBatch(Request& request, size_t batch, AlignedBuffer& scratch);
  // Reads every op of the extents [first, last) of `plan` into `buffer`, the
  // extents laid out as BatchLayout says.
  absl::Status ReadExtents(const ReadPlan& plan, uint32_t first, uint32_t last,
                           uint8_t* buffer);
  absl::Status ReadInline(const ReadPlan& plan);

  const PreadPoolReaderOptions options_;
  ReaderCounters counters_;

  absl::Mutex mu_;
  // Work items: each is a request whose batches a worker pulls until none
  // are left. shared_ptr: the caller, every queued item and every worker
  // serving the request hold it; an abandoned request lives until the last
  // worker lets go.
  std::deque<std::shared_ptr<Request>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_IO_PREAD_POOL_READER_H_
