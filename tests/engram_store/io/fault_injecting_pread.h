#ifndef MNEME_TESTS_ENGRAM_STORE_IO_FAULT_INJECTING_PREAD_H_
#define MNEME_TESTS_ENGRAM_STORE_IO_FAULT_INJECTING_PREAD_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engram_store/io/pread_pool_reader.h"

namespace mneme::engram::testing {

// A file layer under PreadPoolReader (PreadPoolReaderOptions::pread) that
// injects faults into real pread(2) calls: errno failures, short reads and
// stalls, each for reads overlapping a byte range of the file. Thread-safe;
// must outlive the reader it is given to.
class FaultInjectingPread {
 public:
  FaultInjectingPread() = default;
  FaultInjectingPread(const FaultInjectingPread&) = delete;
  FaultInjectingPread& operator=(const FaultInjectingPread&) = delete;

  // The function to put into PreadPoolReaderOptions::pread.
  PreadFunction AsFunction();

  // Reads overlapping [begin, end) fail with `err` (e.g. EIO), `times` times
  // (-1: always).
  void FailRange(uint64_t begin, uint64_t end, int err, int times = -1);
  // Every read returns at most `max_bytes` (> 0) bytes; the bytes it was asked
  // for beyond those are overwritten with garbage, so a reader that trusts
  // them is caught. 0 turns this off.
  void ShortenReads(size_t max_bytes);
  // Reads overlapping [begin, end) block until Release().
  void StallRange(uint64_t begin, uint64_t end);
  // Unblocks stalled reads (which then read normally) and stops stalling.
  void Release();
  // Blocks until `n` reads are stalled.
  void WaitForStalled(int n);
  // Blocks until no read is stalled or finishing a stall.
  void WaitUntilNoneStalled();

  // Calls so far that touched the file.
  int calls() const;

 private:
  struct Failure {
    uint64_t begin;
    uint64_t end;
    int err;
    int times;
  };

  ssize_t Pread(int fd, void* buf, size_t count, off_t offset);

  mutable absl::Mutex mu_;
  std::vector<Failure> failures_ ABSL_GUARDED_BY(mu_);
  size_t max_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stalling_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t stall_begin_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stall_end_ ABSL_GUARDED_BY(mu_) = 0;
  int stalled_ ABSL_GUARDED_BY(mu_) = 0;  // In a stall or finishing one.
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // Blocked in a stall now.
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_IO_FAULT_INJECTING_PREAD_H_
