#include "engram_store/io/pread_pool_reader.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace mneme::engram {

namespace {

// Extents of a batch sit in one buffer, each at an offset aligned for its
// file (and to a cache line at least).
uint64_t ExtentBufferAlignment(const ReadPlan::Extent& extent) {
  return std::max<uint64_t>(64, extent.file->alignment());
}

// Bytes of buffer the extents [first, last) of `plan` need.
uint64_t BatchBytes(const ReadPlan& plan, uint32_t first, uint32_t last) {
  uint64_t bytes = 0;
  for (uint32_t i = first; i < last; ++i) {
    const ReadPlan::Extent& extent = plan.extents[i];
    bytes = AlignUp(bytes, ExtentBufferAlignment(extent)) + extent.length;
  }
  return bytes;
}

// Copies the spans of the extents [first, last), laid out as BatchBytes does,
// from `buffer`. Returns the bytes copied.
uint64_t CopyBatch(const ReadPlan& plan, uint32_t first, uint32_t last,
                   const uint8_t* buffer) {
  uint64_t bytes = 0;
  uint64_t position = 0;
  for (uint32_t i = first; i < last; ++i) {
    const ReadPlan::Extent& extent = plan.extents[i];
    position = AlignUp(position, ExtentBufferAlignment(extent));
    bytes += CopyExtent(plan, extent, buffer + position);
    position += extent.length;
  }
  return bytes;
}

// Inline reads pay off only where they hit the page cache: kDirect reads go
// to the device every time and gain from the workers' parallelism (a 48-row
// O_DIRECT batch took twice as long inline as through the pool in
// io_row_reader_bench), and a kNfs server may hang, which only the pool's
// deadline handling survives.
bool AllBuffered(const ReadPlan& plan) {
  for (const ReadPlan::Extent& extent : plan.extents) {
    if (extent.file->mode() != OpenMode::kBuffered) return false;
  }
  return true;
}

// A worker's scratch above this is freed after use, so that one request with
// a long run of touching spans does not pin its buffer forever.
uint64_t ScratchKeepBytes(const PreadPoolReaderOptions& options) {
  return static_cast<uint64_t>(options.reads_per_task) *
         options.coalesce.max_read_bytes;
}

}  // namespace

// One Read() in the pool.
struct PreadPoolReader::Request {
  ReadPlan plan;
  std::vector<uint32_t> bounds;  // Batch i: extents [bounds[i], bounds[i+1]).
  absl::Time deadline;
  std::atomic<size_t> next_batch{0};

  absl::Mutex mu;
  size_t batches_done ABSL_GUARDED_BY(mu) = 0;  // Read and copied, or skipped.
  absl::Status status ABSL_GUARDED_BY(mu);      // First error.
  // Set by the caller when it stops waiting (deadline or error): from then on
  // nothing is copied to the caller's buffers.
  bool abandoned ABSL_GUARDED_BY(mu) = false;
  int copies_running ABSL_GUARDED_BY(mu) = 0;

  size_t num_batches() const { return bounds.size() - 1; }
};

absl::StatusOr<std::unique_ptr<PreadPoolReader>> PreadPoolReader::Create(
    const PreadPoolReaderOptions& options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PreadPoolReaderOptions.threads must be >= 1, got ", options.threads));
  }
  if (options.queue_capacity < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PreadPoolReaderOptions.queue_capacity must be >= 1, got ",
                     options.queue_capacity));
  }
  if (options.reads_per_task < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PreadPoolReaderOptions.reads_per_task must be >= 1, got ",
                     options.reads_per_task));
  }
  if (options.inline_max_spans < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PreadPoolReaderOptions.inline_max_spans must be >= 0, got ",
        options.inline_max_spans));
  }
  if (absl::Status s = ValidateCoalesceOptions(
          options.coalesce, "PreadPoolReaderOptions.coalesce");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<PreadPoolReader>(new PreadPoolReader(options));
}

PreadPoolReader::PreadPoolReader(const PreadPoolReaderOptions& options)
    : options_(options) {
  workers_.reserve(options_.threads);
  for (int i = 0; i < options_.threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
    // Best effort: the name only helps whoever looks at the process.
    pthread_setname_np(workers_.back().native_handle(), "mneme-pread");
  }
}

PreadPoolReader::~PreadPoolReader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void PreadPoolReader::WorkerLoop() {
  AlignedBuffer scratch;
  for (;;) {
    std::shared_ptr<Request> request;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PreadPoolReader* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->queue_.empty();
          },
          this));
      // Work still queued at shutdown belongs to abandoned requests (every
      // Read() has returned by then), so it is dropped.
      if (stopping_) return;
      request = std::move(queue_.front());
      queue_.pop_front();
    }
    for (size_t batch = request->next_batch.fetch_add(1);
         batch < request->num_batches();
         batch = request->next_batch.fetch_add(1)) {
      RunBatch(*request, batch, scratch);
    }
  }
}

void PreadPoolReader::RunBatch(Request& request, size_t batch,
                               AlignedBuffer& scratch) {
  {
    absl::MutexLock lock(&request.mu);
    if (!request.abandoned && request.status.ok() &&
        absl::Now() >= request.deadline) {
      // Skipped, so the request must not look complete.
      request.status = absl::DeadlineExceededError(
          "row read: deadline passed before all batches started");
    }
    if (request.abandoned || !request.status.ok()) {
      ++request.batches_done;
      return;
    }
  }
  const uint32_t first = request.bounds[batch];
  const uint32_t last = request.bounds[batch + 1];
  const uint64_t bytes = BatchBytes(request.plan, first, last);
  scratch.Reserve(bytes);
  absl::Status status = ReadExtents(request.plan, first, last, scratch.data());
  bool deliver = false;
  {
    absl::MutexLock lock(&request.mu);
    if (!status.ok()) {
      if (request.status.ok()) request.status = std::move(status);
    } else if (!request.abandoned) {
      // Registered under the lock, so the caller, once it has set
      // `abandoned`, waits for this copy instead of returning under it.
      ++request.copies_running;
      deliver = true;
    }
    if (!deliver) ++request.batches_done;
  }
  if (deliver) {
    const uint64_t copied =
        CopyBatch(request.plan, first, last, scratch.data());
    ReaderCounters::Add(counters_.bytes_delivered, copied);
    absl::MutexLock lock(&request.mu);
    --request.copies_running;
    ++request.batches_done;
  }
  if (scratch.capacity() > ScratchKeepBytes(options_)) scratch.Clear();
}

absl::Status PreadPoolReader::ReadExtents(const ReadPlan& plan, uint32_t first,
                                          uint32_t last, uint8_t* buffer) {
  uint64_t position = 0;
  for (uint32_t e = first; e < last; ++e) {
    const ReadPlan::Extent& extent = plan.extents[e];
    const RowFile& file = *extent.file;
    position = AlignUp(position, ExtentBufferAlignment(extent));
    uint8_t* extent_buffer = buffer + position;
    position += extent.length;
    for (uint32_t o = extent.first_op; o < extent.first_op + extent.num_ops;
         ++o) {
      const ReadPlan::Op& op = plan.ops[o];
      OpCursor cursor(op, file.alignment());
      for (;;) {
        const uint64_t at = op.extent_offset + cursor.NextOffset();
        const uint64_t length = cursor.NextLength();
        const ssize_t n =
            options_.pread
                ? options_.pread(file.fd(), extent_buffer + at, length,
                                 static_cast<off_t>(extent.offset + at))
                : ::pread(file.fd(), extent_buffer + at, length,
                          static_cast<off_t>(extent.offset + at));
        const int err = errno;
        ReaderCounters::Add(counters_.reads, 1);
        if (n < 0) {
          if (err == EINTR) continue;
          return ReadErrnoError(file, extent.offset + at, length, err);
        }
        ReaderCounters::Add(counters_.bytes_read, static_cast<uint64_t>(n));
        const OpCursor::Step step = cursor.Advance(static_cast<uint64_t>(n));
        if (step == OpCursor::Step::kComplete) break;
        if (step == OpCursor::Step::kEndOfFile) {
          return EndOfFileError(
              file, extent.offset + op.extent_offset + cursor.done(),
              op.required - cursor.done());
        }
      }
    }
    ReaderCounters::Add(counters_.bytes_released,
                        ReleasePages(file, extent.offset, extent.length));
  }
  return absl::OkStatus();
}

absl::Status PreadPoolReader::ReadInline(const ReadPlan& plan) {
  // Per calling thread, reused across calls; inline batches are small.
  thread_local AlignedBuffer buffer;
  const uint32_t last = static_cast<uint32_t>(plan.extents.size());
  buffer.Reserve(BatchBytes(plan, 0, last));
  absl::Status status = ReadExtents(plan, 0, last, buffer.data());
  if (status.ok()) {
    ReaderCounters::Add(counters_.bytes_delivered,
                        CopyBatch(plan, 0, last, buffer.data()));
  }
  if (buffer.capacity() > ScratchKeepBytes(options_)) buffer.Clear();
  return status;
}

absl::Status PreadPoolReader::Read(absl::Span<const ReadSpan> spans,
                                   absl::Time deadline) {
  ASSIGN_OR_RETURN(ReadPlan plan,
                   BeginRead(spans, options_.coalesce, deadline, counters_));
  if (plan.extents.empty()) return absl::OkStatus();

  if (plan.spans < static_cast<uint64_t>(options_.inline_max_spans) &&
      AllBuffered(plan)) {
    ReaderCounters::Add(counters_.inline_requests, 1);
    absl::Status status = ReadInline(plan);
    counters_.CountResult(status);
    return status;
  }

  auto request = std::make_shared<Request>();
  request->deadline = deadline;
  // Spread the reads over all workers, at most reads_per_task per batch.
  const size_t threads = static_cast<size_t>(options_.threads);
  const size_t ops_per_batch =
      std::clamp<size_t>((plan.ops.size() + threads - 1) / threads, 1,
                         static_cast<size_t>(options_.reads_per_task));
  request->bounds = BatchExtents(plan, ops_per_batch);
  request->plan = std::move(plan);
  const size_t num_batches = request->num_batches();

  {
    absl::MutexLock lock(&mu_);
    const size_t capacity = static_cast<size_t>(options_.queue_capacity);
    const bool room = mu_.AwaitWithDeadline(
        absl::Condition(
            +[](PreadPoolReader* self)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                   return self->queue_.size() <
                          static_cast<size_t>(self->options_.queue_capacity);
                 },
            this),
        deadline);
    if (!room) {
      absl::Status status = absl::DeadlineExceededError(
          "row read: the I/O queue stayed full until the deadline");
      counters_.CountResult(status);
      return status;
    }
    const size_t items =
        std::min({num_batches, threads, capacity - queue_.size()});
    for (size_t i = 0; i < items; ++i) queue_.push_back(request);
  }

  absl::Status status;
  {
    Request& r = *request;
    absl::MutexLock lock(&r.mu);
    const bool settled = r.mu.AwaitWithDeadline(
        absl::Condition(
            +[](Request* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu) {
              return q->batches_done == q->num_batches() || !q->status.ok();
            },
            &r),
        deadline);
    if (settled && r.status.ok()) {
      status = absl::OkStatus();
    } else {
      status =
          settled
              ? r.status
              : absl::DeadlineExceededError(absl::StrCat(
                    "row read: ", r.num_batches() - r.batches_done, " of ",
                    r.num_batches(), " batches still unread at the deadline"));
      // Stop further batches and wait out copies already under way (memcpy
      // only), so nothing touches the caller's buffers after we return.
      r.abandoned = true;
      r.mu.Await(absl::Condition(
          +[](Request* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu) {
            return q->copies_running == 0;
          },
          &r));
    }
  }
  counters_.CountResult(status);
  return status;
}

}  // namespace mneme::engram
