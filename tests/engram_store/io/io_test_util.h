#ifndef MNEME_TESTS_ENGRAM_STORE_IO_IO_TEST_UTIL_H_
#define MNEME_TESTS_ENGRAM_STORE_IO_IO_TEST_UTIL_H_

// Helpers for the row reader tests: scratch files of random bytes, the
// expected bytes by plain pread, guarded destination buffers and a thread
// count.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engram_store/io/row_file.h"
#include "engram_store/io/row_reader.h"

namespace mneme::engram::testing {

// $TEST_TMPDIR (or /tmp) + "/" + name.
std::string TempPath(absl::string_view name);

// Writes `size` pseudo-random bytes (from `seed`) to `path`.
absl::Status WriteRandomFile(const std::string& path, uint64_t size,
                             uint64_t seed);

// `length` bytes of `path` at `offset`, read with a plain pread(2).
std::vector<uint8_t> PreadBytes(const std::string& path, uint64_t offset,
                                uint64_t length);

// Threads of this process (/proc/self/task), leaving out io_uring's io-wq
// kernel workers ("iou-wrk-*") unless `with_io_uring_workers`.
int CountThreads(bool with_io_uring_workers = false);
// io_uring io-wq workers of this process.
int CountIoUringWorkers();
// CountThreads() once it equals `expected`, or after 10 s whatever it is. A
// joined thread can stay listed in /proc for a moment after pthread_join.
int WaitForThreadCount(int expected);

// Page-cache pages of `path` resident now (mincore over a mapping of it), or
// -1 if that cannot be told.
int64_t ResidentPages(const std::string& path);
// Writes back and drops the page cache of `path` (fdatasync + FADV_DONTNEED).
void DropPageCache(const std::string& path);

// Destinations for a batch of spans, each followed by guard bytes that must
// survive the read, and a check of every span against a plain pread.
class SpanBatch {
 public:
  static constexpr uint8_t kFill = 0xA5;
  static constexpr uint8_t kGuard = 0x5A;
  static constexpr uint64_t kGuardBytes = 16;

  SpanBatch() = default;
  // Movable (the spans keep pointing into the moved memory), not copyable.
  SpanBatch(SpanBatch&&) = default;
  SpanBatch& operator=(SpanBatch&&) = default;
  SpanBatch(const SpanBatch&) = delete;
  SpanBatch& operator=(const SpanBatch&) = delete;

  void Add(const RowFile* file, uint64_t offset, uint64_t length);
  // Adds a span whose destination is at `dest_offset` of the batch's memory,
  // for layouts the caller chooses (e.g. rows packed as weight || scale).
  void AddWithDest(const RowFile* file, uint64_t offset, uint64_t length,
                   uint64_t dest_offset);
  // Allocates and fills the destinations; call after the last Add().
  void Finish();
  // Refills every destination with kFill and the guards with kGuard.
  void Reset();

  const std::vector<ReadSpan>& spans() const { return spans_; }
  size_t size() const { return spans_.size(); }

  // Every span holds its file's bytes and every guard is intact. Returns a
  // description of the first mismatch or "".
  std::string Verify() const;
  // Every destination byte is still kFill and every guard intact.
  bool Untouched() const;

 private:
  struct Entry {
    const RowFile* file;
    uint64_t offset;
    uint64_t length;
    uint64_t dest_offset;
  };
  std::vector<Entry> entries_;
  std::vector<ReadSpan> spans_;
  std::vector<uint8_t> memory_;
  std::vector<uint8_t> fresh_;  // memory_ as Reset() leaves it.
  uint64_t end_ = 0;
};

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_IO_IO_TEST_UTIL_H_
