#ifndef MNEME_ENGRAM_STORE_IO_READ_PLAN_H_
#define MNEME_ENGRAM_STORE_IO_READ_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engram_store/io/row_reader.h"

namespace mneme::engram {

// How spans become reads. Shared by every RowReader implementation.
struct CoalesceOptions {
  // Largest hole, in bytes, between two spans of one file that a single read
  // bridges instead of issuing two reads. 0 merges only spans that touch or
  // overlap. Default: 4096 (one page: reading it costs less than a syscall).
  uint64_t max_gap_bytes = 4096;
  // Largest single read, in bytes; also the longest span accepted. Must be a
  // positive multiple of RowFile::kDirectAlignment. Spans that touch or
  // overlap (or share a page, for kDirect) always share one extent; an extent
  // longer than this is read in pieces of at most this size. Default: 256 KiB.
  uint64_t max_read_bytes = 256 << 10;
};

// InvalidArgument naming `<prefix>.<field>` if `options` are invalid.
absl::Status ValidateCoalesceOptions(const CoalesceOptions& options,
                                     absl::string_view prefix);

// The reads that serve one batch of spans: a pure function of the spans, with
// no I/O. Executors give each extent a buffer (aligned to its file's
// alignment), issue its ops into that buffer, and once all ops of an extent
// are done, run its copies.
struct ReadPlan {
  // A contiguous range of one file, read into one buffer.
  struct Extent {
    const RowFile* file = nullptr;
    uint64_t offset = 0;  // File offset; aligned for kDirect.
    uint64_t length = 0;  // Buffer bytes; aligned for kDirect.
    uint32_t first_op = 0;
    uint32_t num_ops = 0;
    uint32_t first_copy = 0;
    uint32_t num_copies = 0;
  };
  // One read of (part of) an extent.
  struct Op {
    uint32_t extent = 0;
    uint64_t extent_offset = 0;  // Where it starts in the extent (and buffer).
    uint64_t length = 0;         // Bytes to ask for.
    // Bytes that must arrive (<= length). Less than `length` only for the
    // last op of a kDirect extent, whose final page may end at end of file.
    uint64_t required = 0;
  };
  // Delivers one span: extent bytes [extent_offset, +length) to `dest`.
  struct Copy {
    uint64_t extent_offset = 0;
    uint64_t length = 0;
    uint8_t* dest = nullptr;
  };

  std::vector<Extent> extents;  // Sorted by (file, offset).
  std::vector<Op> ops;          // Grouped by extent, in extent order.
  std::vector<Copy> copies;     // Grouped by extent, in extent order.
  uint64_t spans = 0;           // Non-empty spans in the batch.
  uint64_t unique_spans = 0;    // Distinct (file, offset, length) among them.
};

// Plans the reads of `spans`: drops empty spans, deduplicates identical ones,
// widens kDirect spans to whole pages and merges the spans of each file into
// extents as CoalesceOptions says. Errors: InvalidArgument (no file, no dest,
// span longer than max_read_bytes, too many spans), OutOfRange (span past the
// file's size), each naming the span's index and file.
absl::StatusOr<ReadPlan> PlanReads(absl::Span<const ReadSpan> spans,
                                   const CoalesceOptions& options);

// Splits the extents of `plan` into consecutive batches of whole extents with
// about `ops_per_batch` ops each (an extent with more ops is a batch of its
// own). Returns the batch boundaries as extent indices: batch i is
// [result[i], result[i + 1]). `ops_per_batch` must be positive.
std::vector<uint32_t> BatchExtents(const ReadPlan& plan, size_t ops_per_batch);

// Rounds `value` down / up to a multiple of `alignment` (a power of two).
inline uint64_t AlignDown(uint64_t value, uint64_t alignment) {
  return value & ~(alignment - 1);
}
inline uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return AlignDown(value + alignment - 1, alignment);
}

// Follows one op across short reads. A read may return fewer bytes than asked
// (signals, network file systems, end of file); the remainder is asked for
// again from NextOffset() - for kDirect files from the page the last read
// ended in, as O_DIRECT offsets must stay aligned. A read that adds nothing
// means the file ends before the op's required bytes: EOF.
class OpCursor {
 public:
  enum class Step { kComplete, kResubmit, kEndOfFile };

  OpCursor() = default;
  OpCursor(const ReadPlan::Op& op, uint64_t alignment)
      : length_(op.length), required_(op.required), alignment_(alignment) {}

  // Offset in the op (and its buffer) of the next read, and its length.
  uint64_t NextOffset() const { return AlignDown(done_, alignment_); }
  uint64_t NextLength() const { return length_ - NextOffset(); }
  // Bytes of the op known to be read, from its start.
  uint64_t done() const { return done_; }

  // Records that the read issued at NextOffset() returned `got` bytes (>= 0).
  Step Advance(uint64_t got) {
    const uint64_t end = NextOffset() + got;
    const bool progress = end > done_;
    if (progress) done_ = end;
    if (done_ >= required_) return Step::kComplete;
    return progress ? Step::kResubmit : Step::kEndOfFile;
  }

 private:
  uint64_t length_ = 0;
  uint64_t required_ = 0;
  uint64_t alignment_ = 1;
  uint64_t done_ = 0;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_IO_READ_PLAN_H_
