#ifndef MNEME_ENGRAM_STORE_IO_ROW_READER_H_
#define MNEME_ENGRAM_STORE_IO_ROW_READER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engram_store/io/row_file.h"

namespace mneme::engram {

// One byte range to read: `length` bytes of `file` at absolute `offset`, to be
// stored at `dest`. An Engram row is two spans of one shard file (its weight
// bytes in the weight tensor and its scale bytes in the scale tensor); callers
// point the two `dest`s at adjacent memory to get the row packed as
// weight || scale. A span with length 0 is a no-op.
struct ReadSpan {
  const RowFile* file = nullptr;  // Borrowed; see RowFile for its lifetime.
  uint64_t offset = 0;            // Absolute byte offset in the file.
  uint64_t length = 0;            // Bytes.
  uint8_t* dest = nullptr;        // Borrowed; `length` writable bytes.
};

// Counters since the reader was created (monotonic; for metrics).
struct RowReaderStats {
  uint64_t requests = 0;         // Read() calls.
  uint64_t inline_requests = 0;  // Of those, run on the caller's thread.
  uint64_t spans = 0;            // Non-empty spans asked for.
  uint64_t unique_spans = 0;     // After deduplicating identical spans.
  uint64_t reads = 0;            // Read syscalls / submissions (with retries).
  uint64_t bytes_read = 0;       // Bytes those reads returned.
  uint64_t bytes_delivered = 0;  // Bytes copied into callers' spans.
  uint64_t bytes_released = 0;   // Page-cache bytes dropped (kNfs files).
  uint64_t deadline_exceeded = 0;  // Read() calls that hit their deadline.
  uint64_t failed_requests = 0;    // Read() calls with any other error.
};

// Reads batches of byte ranges (the rows of Engram tables) from shard files.
// The seam between the store and its I/O engines: implementations are the
// pread thread pool (pread_pool_reader.h) and io_uring (uring_row_reader.h);
// tests wrap either with a fault-injecting reader.
//
// Every implementation deduplicates identical spans of a batch (read once,
// copied to each `dest`), coalesces spans of one file that lie close together
// into larger reads, and for kDirect files reads whole aligned pages into its
// own aligned buffers, reading a page shared by several spans once.
//
// Thread-safe: any number of threads may call Read() at once. The reader must
// outlive its calls, and destroying it waits for reads still in flight,
// including ones abandoned at their deadline.
class RowReader {
 public:
  virtual ~RowReader() = default;

  // Fills every span's `dest` with the file bytes at its offset.
  //
  // OK means every span holds exactly the bytes of its file. Otherwise the
  // contents of the `dest`s are unspecified (some may have been filled), but
  // nothing writes to any of them after Read() returns: I/O lands in buffers
  // the reader owns and is copied out only while the caller still waits.
  //
  // Errors:
  //   InvalidArgument: a span without a file, a non-empty span without a
  //     destination, or a span longer than the reader's max read size.
  //   OutOfRange: a span past the end of its file (as sized when opened).
  //   DataLoss: the file ended early (truncated under the store) or the
  //     device reported EIO; the message names the file and the offset.
  //   DeadlineExceeded: `deadline` passed before every span was read (also
  //     when it has passed on entry).
  //   Other codes from errno for other read failures (e.g.
  //     ResourceExhausted for ENOMEM); Internal if the I/O engine itself
  //     fails (an io_uring call).
  virtual absl::Status Read(absl::Span<const ReadSpan> spans,
                            absl::Time deadline) = 0;

  virtual RowReaderStats GetStats() const = 0;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_IO_ROW_READER_H_
