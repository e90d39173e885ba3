#ifndef MNEME_ENGRAM_STORE_IO_READ_SUPPORT_H_
#define MNEME_ENGRAM_STORE_IO_READ_SUPPORT_H_

// Pieces shared by the RowReader implementations: owned aligned buffers, the
// error statuses of failed reads, page release for kNfs files and counters.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engram_store/io/read_plan.h"
#include "engram_store/io/row_file.h"
#include "engram_store/io/row_reader.h"

namespace mneme::engram {

// A heap buffer aligned for O_DIRECT (RowFile::kDirectAlignment). Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  // Makes the buffer at least `bytes` long; the contents are not kept.
  // CHECK-fails if memory cannot be had (like operator new).
  void Reserve(size_t bytes);
  // Frees the memory.
  void Clear();

  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

// The status of a read of `file` at `offset` (`length` bytes) that failed with
// errno `err`: DataLoss for EIO (the device lost the bytes), otherwise the
// errno's code. Names the file, offset and strerror.
absl::Status ReadErrnoError(const RowFile& file, uint64_t offset,
                            uint64_t length, int err);

// DataLoss: `file` ended at `offset` while `missing` more bytes were needed.
absl::Status EndOfFileError(const RowFile& file, uint64_t offset,
                            uint64_t missing);

// For kNfs files, drops the page-cache pages of [offset, offset + length)
// (widened to whole pages, POSIX_FADV_DONTNEED) and returns the bytes covered;
// for other modes does nothing and returns 0.
uint64_t ReleasePages(const RowFile& file, uint64_t offset, uint64_t length);

// Copies the spans of `extent`, whose bytes are at `buffer`, to their
// destinations. Returns the bytes copied.
uint64_t CopyExtent(const ReadPlan& plan, const ReadPlan::Extent& extent,
                    const uint8_t* buffer);

// Lock-free RowReaderStats counters.
class ReaderCounters {
 public:
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> inline_requests{0};
  std::atomic<uint64_t> spans{0};
  std::atomic<uint64_t> unique_spans{0};
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_delivered{0};
  std::atomic<uint64_t> bytes_released{0};
  std::atomic<uint64_t> deadline_exceeded{0};
  std::atomic<uint64_t> failed_requests{0};

  static void Add(std::atomic<uint64_t>& counter, uint64_t value) {
    counter.fetch_add(value, std::memory_order_relaxed);
  }
  // Counts the outcome of one Read() call.
  void CountResult(const absl::Status& status);
  RowReaderStats Snapshot() const;
};

// The start of every RowReader::Read(): counts the request, plans the reads
// of `spans` (PlanReads) and counts their spans, then checks `deadline`.
// Returns the plan to execute, or the error that ends the call
// (PlanReads's errors; DeadlineExceeded if the deadline has passed), already
// counted with CountResult. A plan without extents needs no I/O: the read is
// complete.
absl::StatusOr<ReadPlan> BeginRead(absl::Span<const ReadSpan> spans,
                                   const CoalesceOptions& options,
                                   absl::Time deadline,
                                   ReaderCounters& counters);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_IO_READ_SUPPORT_H_
