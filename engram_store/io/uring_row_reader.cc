#include "engram_store/io/uring_row_reader.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace mneme::engram {

namespace {

// user_data of cancel requests; read requests carry their op index. (liburing
// reserves UINT64_MAX for its internal timeouts.)
constexpr uint64_t kCancelTag = ~uint64_t{0} - 1;

uint64_t ExtentBufferAlignment(const ReadPlan::Extent& extent) {
  return std::max<uint64_t>(64, extent.file->alignment());
}

// Waits for a completion until `deadline`. 0, -ETIME at the deadline, or
// another -errno.
int WaitCqe(io_uring* ring, io_uring_cqe** cqe, absl::Time deadline) {
  for (;;) {
    int r;
    if (deadline == absl::InfiniteFuture()) {
      r = io_uring_wait_cqe(ring, cqe);
    } else {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        r = io_uring_peek_cqe(ring, cqe);
        return r == -EAGAIN ? -ETIME : r;
      }
      const timespec t = absl::ToTimespec(left);
      __kernel_timespec ts;
      ts.tv_sec = t.tv_sec;
      ts.tv_nsec = t.tv_nsec;
      r = io_uring_wait_cqe_timeout(ring, cqe, &ts);
    }
    if (r != -EINTR) return r;
  }
}

// A ring buffer of extent buffers inside one arena. Extents are allocated in
// order and freed in the same order (an extent's space is reclaimed once it
// and every earlier one are done).
class ExtentArena {
 public:
  explicit ExtentArena(uint64_t capacity) : capacity_(capacity) {}

  // Offset of `length` bytes aligned to `alignment`, or false if they do not
  // fit now.
  bool Allocate(uint64_t length, uint64_t alignment, uint64_t* offset) {
    if (live_.empty()) {
      head_ = tail_ = 0;
      wrapped_ = false;
    }
    uint64_t start = AlignUp(head_, alignment);
    if (!wrapped_) {  // Live bytes: [tail_, head_).
      if (start + length > capacity_) {
        if (length > tail_) return false;
        start = 0;
        wrapped_ = true;
      }
    } else if (start + length > tail_) {  // Live: [tail_, cap) and [0, head_).
      return false;
    }
    head_ = start + length;
    live_.push_back(start);
    *offset = start;
    return true;
  }

  // Frees the oldest allocation.
  void FreeOldest() {
    live_.pop_front();
    if (live_.empty()) return;
    if (live_.front() < tail_) wrapped_ = false;
    tail_ = live_.front();
  }

 private:
  const uint64_t capacity_;
  std::deque<uint64_t> live_;  // Offsets of live allocations, oldest first.
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  bool wrapped_ = false;
};

}  // namespace

// One io_uring and the buffer its reads land in. Used by one Read() at a time
// (whoever took it from free_), so its fields need no lock.
struct UringRowReader::Ring {
  io_uring uring;
  bool initialized = false;
  AlignedBuffer buffer;
  // Completions still owed to abandoned reads (reads and their cancels).
  // Until it is 0 the kernel may write into `buffer`.
  uint64_t owed = 0;

  // Reaps owed completions until `deadline`. DeadlineExceeded if some remain.
  absl::Status Drain(absl::Time deadline) {
    while (owed > 0) {
      if (io_uring_sq_ready(&uring) > 0) io_uring_submit(&uring);
      io_uring_cqe* cqe = nullptr;
      const int r = WaitCqe(&uring, &cqe, deadline);
      if (r == -ETIME) {
        return absl::DeadlineExceededError(absl::StrCat(
            "row read: ", owed,
            " abandoned reads of an io_uring ring still in flight at the "
            "deadline"));
      }
      if (r < 0) {
        return absl::InternalError(
            absl::StrCat("io_uring wait: ", std::strerror(-r)));
      }
      unsigned head;
      unsigned seen = 0;
      io_uring_for_each_cqe(&uring, head, cqe) { ++seen; }
      io_uring_cq_advance(&uring, seen);
      owed -= std::min<uint64_t>(owed, seen);
    }
    return absl::OkStatus();
  }

  ~Ring() {
    if (!initialized) return;
    // The kernel may write into `buffer` until every read has completed.
    (void)Drain(absl::InfiniteFuture());
    io_uring_queue_exit(&uring);
  }
};

absl::StatusOr<std::unique_ptr<UringRowReader>> UringRowReader::Create(
    const UringRowReaderOptions& options) {
  if (options.rings < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UringRowReaderOptions.rings must be >= 1, got ", options.rings));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("UringRowReaderOptions.queue_depth must be in [1, 4096], "
                     "got ",
                     options.queue_depth));
  }
  if (options.max_kernel_workers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UringRowReaderOptions.max_kernel_workers must be >= 0, "
                     "got ",
                     options.max_kernel_workers));
  }
  if (absl::Status s = ValidateCoalesceOptions(
          options.coalesce, "UringRowReaderOptions.coalesce");
      !s.ok()) {
    return s;
  }
  if (options.buffer_bytes < options.coalesce.max_read_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UringRowReaderOptions.buffer_bytes (", options.buffer_bytes,
        ") must be >= coalesce.max_read_bytes (",
        options.coalesce.max_read_bytes, ")"));
  }
  std::unique_ptr<UringRowReader> reader(new UringRowReader(options));
  for (int i = 0; i < options.rings; ++i) {
    auto ring = std::make_unique<Ring>();
    // Without SUBMIT_ALL (before Linux 5.18) a bad entry stops a submission;
    // ours never are, so the plain setup is as good.
    int r = io_uring_queue_init(static_cast<unsigned>(options.queue_depth),
                                &ring->uring, IORING_SETUP_SUBMIT_ALL);
    if (r == -EINVAL) {
      r = io_uring_queue_init(static_cast<unsigned>(options.queue_depth),
                              &ring->uring, 0);
    }
    if (r < 0) {
      return absl::UnavailableError(absl::StrCat(
          "io_uring_queue_init(", options.queue_depth,
          ") failed: ", std::strerror(-r),
          " (kernel without io_uring, io_uring_disabled sysctl or a seccomp "
          "sandbox); use the pread pool instead"));
    }
    ring->initialized = true;
    if (options.max_kernel_workers > 0) {
      unsigned limits[2] = {static_cast<unsigned>(options.max_kernel_workers),
                            static_cast<unsigned>(options.max_kernel_workers)};
      r = io_uring_register_iowq_max_workers(&ring->uring, limits);
      if (r < 0) {
        return absl::UnavailableError(absl::StrCat(
            "io_uring_register_iowq_max_workers: ", std::strerror(-r),
            " (needs Linux 5.15)"));
      }
    }
    ring->buffer.Reserve(options.buffer_bytes);
    reader->rings_.push_back(std::move(ring));
  }
  absl::MutexLock lock(&reader->mu_);
  for (auto& ring : reader->rings_) reader->free_.push_back(ring.get());
  return reader;
}

UringRowReader::UringRowReader(const UringRowReaderOptions& options)
    : options_(options) {}

// Every Read() has returned; ~Ring waits for abandoned reads.
UringRowReader::~UringRowReader() = default;

absl::StatusOr<UringRowReader::Ring*> UringRowReader::Acquire(
    absl::Time deadline) {
  Ring* ring = nullptr;
  {
    absl::MutexLock lock(&mu_);
    const bool got = mu_.AwaitWithDeadline(
        absl::Condition(
            +[](UringRowReader* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
              return !self->free_.empty();
            },
            this),
        deadline);
    if (!got) {
      return absl::DeadlineExceededError(
          "row read: no io_uring ring came free before the deadline");
    }
    // Prefer a ring that owes nothing.
    auto it = std::find_if(free_.begin(), free_.end(),
                           [](Ring* r) { return r->owed == 0; });
    if (it == free_.end()) it = free_.end() - 1;
    ring = *it;
    free_.erase(it);
  }
  if (absl::Status s = ring->Drain(deadline); !s.ok()) {
    Release(ring);
    return s;
  }
  return ring;
}

void UringRowReader::Release(Ring* ring) {
  absl::MutexLock lock(&mu_);
  free_.push_back(ring);
}

absl::Status UringRowReader::Read(absl::Span<const ReadSpan> spans,
                                  absl::Time deadline) {
  ASSIGN_OR_RETURN(ReadPlan plan,
                   BeginRead(spans, options_.coalesce, deadline, counters_));
  if (plan.extents.empty()) return absl::OkStatus();
  absl::Status status;
  absl::StatusOr<Ring*> ring = Acquire(deadline);
  if (ring.ok()) {
    status = Execute(**ring, plan, deadline);
    Release(*ring);
  } else {
    status = ring.status();
  }
  counters_.CountResult(status);
  return status;
}

absl::Status UringRowReader::Execute(Ring& ring, const ReadPlan& plan,
                                     absl::Time deadline) {
  io_uring* const uring = &ring.uring;
  const size_t num_extents = plan.extents.size();
  const uint64_t depth = static_cast<uint64_t>(options_.queue_depth);

  // The ring owes nothing here, so its buffer may be resized.
  uint64_t longest = 0;
  for (const ReadPlan::Extent& extent : plan.extents) {
    longest = std::max(longest, extent.length);
  }
  const uint64_t capacity =
      std::max(options_.buffer_bytes, AlignUp(longest, 4096));
  if (ring.buffer.capacity() > options_.buffer_bytes &&
      capacity <= options_.buffer_bytes) {
    ring.buffer = AlignedBuffer();  // Give back what a long extent took.
  }
  ring.buffer.Reserve(capacity);
  uint8_t* const buffer = ring.buffer.data();
  ExtentArena arena(capacity);

  std::vector<OpCursor> cursors(plan.ops.size());
  std::vector<uint64_t> extent_at(num_extents);     // Offset in `buffer`.
  std::vector<uint32_t> ops_left(num_extents);      // Ops not yet complete.
  std::vector<uint8_t> in_flight(plan.ops.size());  // Submitted, not reaped.
  std::deque<uint32_t> admitted;  // Extents with buffer space, oldest first.
  std::deque<uint32_t> ready;     // Ops to submit (or resubmit).
  size_t next_extent = 0;
  size_t extents_done = 0;
  uint64_t queued = 0;  // SQEs prepared and not yet reaped.
  absl::Status status;

  // Handles one completion of read op `index` with result `res`.
  auto complete = [&](uint32_t index, int res) {
    in_flight[index] = 0;
    const ReadPlan::Op& op = plan.ops[index];
    const ReadPlan::Extent& extent = plan.extents[op.extent];
    OpCursor& cursor = cursors[index];
    if (res < 0) {
      if (res == -EINTR || res == -EAGAIN) {
        ready.push_front(index);
      } else if (status.ok()) {
        status = ReadErrnoError(
            *extent.file,
            extent.offset + op.extent_offset + cursor.NextOffset(),
            cursor.NextLength(), -res);
      }
      return;
    }
    ReaderCounters::Add(counters_.bytes_read, static_cast<uint64_t>(res));
    switch (cursor.Advance(static_cast<uint64_t>(res))) {
      case OpCursor::Step::kResubmit:
        ready.push_back(index);
        return;
      case OpCursor::Step::kEndOfFile:
        if (status.ok()) {
          status = EndOfFileError(
              *extent.file, extent.offset + op.extent_offset + cursor.done(),
              op.required - cursor.done());
        }
        return;
      case OpCursor::Step::kComplete:
        break;
    }
    if (--ops_left[op.extent] > 0 || !status.ok()) return;
    ReaderCounters::Add(
        counters_.bytes_released,
        ReleasePages(*extent.file, extent.offset, extent.length));
    ReaderCounters::Add(
        counters_.bytes_delivered,
        CopyExtent(plan, extent, buffer + extent_at[op.extent]));
    ++extents_done;
    while (!admitted.empty() && ops_left[admitted.front()] == 0) {
      admitted.pop_front();
      arena.FreeOldest();
    }
  };

  while (status.ok() && extents_done < num_extents) {
    if (absl::Now() >= deadline) {
      status = absl::DeadlineExceededError(
          absl::StrCat("row read: ", num_extents - extents_done, " of ",
                       num_extents, " extents still unread at the deadline"));
      break;
    }
    // Admit extents while their buffers fit and there is work to queue.
    while (next_extent < num_extents && ready.size() < depth) {
      const ReadPlan::Extent& extent = plan.extents[next_extent];
      if (!arena.Allocate(extent.length, ExtentBufferAlignment(extent),
                          &extent_at[next_extent])) {
        break;
      }
      ops_left[next_extent] = extent.num_ops;
      for (uint32_t o = extent.first_op; o < extent.first_op + extent.num_ops;
           ++o) {
        cursors[o] = OpCursor(plan.ops[o], extent.file->alignment());
        ready.push_back(o);
      }
      admitted.push_back(static_cast<uint32_t>(next_extent));
      ++next_extent;
    }
    // Queue reads up to the depth.
    while (queued < depth && !ready.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(uring);
      if (sqe == nullptr) break;
      const uint32_t index = ready.front();
      ready.pop_front();
      const ReadPlan::Op& op = plan.ops[index];
      const ReadPlan::Extent& extent = plan.extents[op.extent];
      const OpCursor& cursor = cursors[index];
      const uint64_t at = op.extent_offset + cursor.NextOffset();
      io_uring_prep_read(
          sqe, extent.file->fd(), buffer + extent_at[op.extent] + at,
          static_cast<unsigned>(cursor.NextLength()), extent.offset + at);
      io_uring_sqe_set_data64(sqe, index);
      in_flight[index] = 1;
      ++queued;
      ReaderCounters::Add(counters_.reads, 1);
    }
    if (io_uring_sq_ready(uring) > 0) {
      const int r = io_uring_submit(uring);
      // EAGAIN/EBUSY: short of kernel resources; reap and retry.
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        status = absl::InternalError(
            absl::StrCat("io_uring_submit: ", std::strerror(-r)));
        break;
      }
      if (r < 0 && queued == io_uring_sq_ready(uring)) {
        // Nothing in the kernel to wait for: back off, then submit again.
        absl::SleepFor(absl::Microseconds(50));
        continue;
      }
    }
    if (queued == 0) {
      // Nothing in flight and nothing admitted: cannot happen, as an empty
      // arena fits any extent.
      status = absl::InternalError("io_uring row read made no progress");
      break;
    }
    io_uring_cqe* cqe = nullptr;
    const int r = WaitCqe(uring, &cqe, deadline);
    if (r == -ETIME) {
      status = absl::DeadlineExceededError(
          absl::StrCat("row read: ", num_extents - extents_done, " of ",
                       num_extents, " extents still unread at the deadline"));
      break;
    }
    if (r < 0) {
      status = absl::InternalError(
          absl::StrCat("io_uring wait: ", std::strerror(-r)));
      break;
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(uring, head, cqe) {
      ++seen;
      --queued;
      complete(static_cast<uint32_t>(io_uring_cqe_get_data64(cqe)), cqe->res);
    }
    io_uring_cq_advance(uring, seen);
  }
  if (status.ok()) return status;

  // Abandon: submit what is prepared (so that it can complete), ask the kernel
  // to cancel what is in flight, and leave the ring owing those completions.
  if (io_uring_sq_ready(uring) > 0) io_uring_submit(uring);
  uint64_t cancels = 0;
  for (uint32_t index = 0; index < in_flight.size(); ++index) {
    if (!in_flight[index]) continue;
    io_uring_sqe* sqe = io_uring_get_sqe(uring);
    if (sqe == nullptr) {
      io_uring_submit(uring);
      sqe = io_uring_get_sqe(uring);
      if (sqe == nullptr) break;  // Best effort: the read completes anyway.
    }
    io_uring_prep_cancel64(sqe, index, 0);
    io_uring_sqe_set_data64(sqe, kCancelTag);
    ++cancels;
  }
  // Unsubmitted cancels are submitted by Drain().
  if (cancels > 0) io_uring_submit(uring);
  ring.owed = queued + cancels;
  return status;
}

}  // namespace mneme::engram
