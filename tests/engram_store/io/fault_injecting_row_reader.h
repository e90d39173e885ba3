#ifndef MNEME_TESTS_ENGRAM_STORE_IO_FAULT_INJECTING_ROW_READER_H_
#define MNEME_TESTS_ENGRAM_STORE_IO_FAULT_INJECTING_ROW_READER_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engram_store/io/row_reader.h"

namespace mneme::engram::testing {

// What a FaultInjectingRowReader does to a matching Read().
enum class ReadFault {
  // Returns DataLoss as a reader does on EIO, without reading.
  kEio,
  // Reads, then overwrites the second half of every matching span with 0xEE
  // and returns DataLoss as a reader does on a short read at end of file: the
  // caller gets partly filled, partly garbage rows and an error.
  kShortRead,
  // Blocks until ReleaseStalls() or the deadline. At the deadline returns
  // DeadlineExceeded without touching any destination; once released, reads
  // normally.
  kStall,
};

// Which reads a fault applies to: a Read() with a span of `path` (any file if
// empty) overlapping [begin, end). `times` matching Read()s get it (-1: all).
struct FaultRule {
  ReadFault fault = ReadFault::kEio;
  std::string path;
  uint64_t begin = 0;
  uint64_t end = std::numeric_limits<uint64_t>::max();
  int times = -1;
};

// A RowReader that wraps a real one and injects faults, for testing what is
// built on readers (tables, caches, the store): EIO, short reads that leave
// garbage behind, and stalls past the deadline. Faults are matched in the
// order added; the first matching rule applies. Thread-safe.
class FaultInjectingRowReader : public RowReader {
 public:
  explicit FaultInjectingRowReader(std::unique_ptr<RowReader> inner);

  void AddFault(const FaultRule& rule);
  void ClearFaults();
  // Lets stalled and future kStall reads proceed.
  void ReleaseStalls();
  // Blocks until `n` reads are stalled.
  void WaitForStalled(int n);
  // Read() calls that got a fault so far.
  int faults_injected() const;

  absl::Status Read(absl::Span<const ReadSpan> spans,
                    absl::Time deadline) override;
  RowReaderStats GetStats() const override { return inner_->GetStats(); }

 private:
  // Finds the first rule matching `spans` (consuming one of its `times`):
  // copies it to *matched and points *span at the first span it matches.
  bool Match(absl::Span<const ReadSpan> spans, FaultRule* matched,
             const ReadSpan** span) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<RowReader> inner_;
  mutable absl::Mutex mu_;
  std::vector<FaultRule> rules_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int stalled_ ABSL_GUARDED_BY(mu_) = 0;
  int injected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_IO_FAULT_INJECTING_ROW_READER_H_
