#include "engram_store/io/read_support.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mneme::engram {

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Clear();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { Clear(); }

void AlignedBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  Clear();
  const size_t size = AlignUp(bytes, RowFile::kDirectAlignment);
  void* memory = nullptr;
  const int err = ::posix_memalign(&memory, RowFile::kDirectAlignment, size);
  CHECK_EQ(err, 0) << "posix_memalign(" << size << "): " << std::strerror(err);
  data_ = static_cast<uint8_t*>(memory);
  capacity_ = size;
}

void AlignedBuffer::Clear() {
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

absl::Status ReadErrnoError(const RowFile& file, uint64_t offset,
                            uint64_t length, int err) {
  const std::string message =
      absl::StrCat("reading '", file.path(), "' at offset ", offset, " (",
                   length, " bytes): ", std::strerror(err));
  if (err == EIO) return absl::DataLossError(message);
  return absl::ErrnoToStatus(err, message);
}

absl::Status EndOfFileError(const RowFile& file, uint64_t offset,
                            uint64_t missing) {
  return absl::DataLossError(
      absl::StrCat("unexpected end of '", file.path(), "' at offset ", offset,
                   " (", missing, " more bytes needed; it had ", file.size(),
                   " bytes when opened - truncated under the store?)"));
}

uint64_t ReleasePages(const RowFile& file, uint64_t offset, uint64_t length) {
  if (file.mode() != OpenMode::kNfs || length == 0) return 0;
  static const uint64_t page_size =
      static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // The kernel drops only whole pages inside the range; the read brought in
  // the partial ones at the ends too.
  const uint64_t begin = AlignDown(offset, page_size);
  const uint64_t end = AlignUp(offset + length, page_size);
  // Advisory: a failure (never expected for a valid descriptor) only leaves
  // pages cached, so it is not worth failing a read that succeeded.
  if (::posix_fadvise(file.fd(), static_cast<off_t>(begin),
                      static_cast<off_t>(end - begin),
                      POSIX_FADV_DONTNEED) != 0) {
    return 0;
  }
  return end - begin;
}

uint64_t CopyExtent(const ReadPlan& plan, const ReadPlan::Extent& extent,
                    const uint8_t* buffer) {
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < extent.num_copies; ++i) {
    const ReadPlan::Copy& copy = plan.copies[extent.first_copy + i];
    std::memcpy(copy.dest, buffer + copy.extent_offset, copy.length);
    bytes += copy.length;
  }
  return bytes;
}

void ReaderCounters::CountResult(const absl::Status& status) {
  if (status.ok()) return;
  if (absl::IsDeadlineExceeded(status)) {
    Add(deadline_exceeded, 1);
  } else {
    Add(failed_requests, 1);
  }
}

RowReaderStats ReaderCounters::Snapshot() const {
  RowReaderStats stats;
  stats.requests = requests.load(std::memory_order_relaxed);
  stats.inline_requests = inline_requests.load(std::memory_order_relaxed);
  stats.spans = spans.load(std::memory_order_relaxed);
  stats.unique_spans = unique_spans.load(std::memory_order_relaxed);
  stats.reads = reads.load(std::memory_order_relaxed);
  stats.bytes_read = bytes_read.load(std::memory_order_relaxed);
  stats.bytes_delivered = bytes_delivered.load(std::memory_order_relaxed);
  stats.bytes_released = bytes_released.load(std::memory_order_relaxed);
  stats.deadline_exceeded = deadline_exceeded.load(std::memory_order_relaxed);
  stats.failed_requests = failed_requests.load(std::memory_order_relaxed);
  return stats;
}

absl::StatusOr<ReadPlan> BeginRead(absl::Span<const ReadSpan> spans,
                                   const CoalesceOptions& options,
                                   absl::Time deadline,
                                   ReaderCounters& counters) {
  ReaderCounters::Add(counters.requests, 1);
  absl::StatusOr<ReadPlan> plan = PlanReads(spans, options);
  if (!plan.ok()) {
    counters.CountResult(plan.status());
    return plan.status();
  }
  ReaderCounters::Add(counters.spans, plan->spans);
  ReaderCounters::Add(counters.unique_spans, plan->unique_spans);
  if (absl::Now() >= deadline) {
    const absl::Status status =
        absl::DeadlineExceededError("row read: deadline passed before start");
    counters.CountResult(status);
    return status;
  }
  return plan;
}

}  // namespace mneme::engram
