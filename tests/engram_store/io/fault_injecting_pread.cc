#include "tests/engram_store/io/fault_injecting_pread.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace mneme::engram::testing {

PreadFunction FaultInjectingPread::AsFunction() {
  return [this](int fd, void* buf, size_t count, off_t offset) {
    return Pread(fd, buf, count, offset);
  };
}

void FaultInjectingPread::FailRange(uint64_t begin, uint64_t end, int err,
                                    int times) {
  absl::MutexLock lock(&mu_);
  failures_.push_back({begin, end, err, times});
}

void FaultInjectingPread::ShortenReads(size_t max_bytes) {
  absl::MutexLock lock(&mu_);
  max_bytes_ = max_bytes;
}

void FaultInjectingPread::StallRange(uint64_t begin, uint64_t end) {
  absl::MutexLock lock(&mu_);
  stalling_ = true;
  stall_begin_ = begin;
  stall_end_ = end;
}

void FaultInjectingPread::Release() {
  absl::MutexLock lock(&mu_);
  stalling_ = false;
}

void FaultInjectingPread::WaitForStalled(int n) {
  absl::MutexLock lock(&mu_);
  std::pair<FaultInjectingPread*, int> arg(this, n);
  mu_.Await(absl::Condition(
      +[](std::pair<FaultInjectingPread*, int>* a)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->first->mu_) {
             return a->first->waiting_ >= a->second;
           },
      &arg));
}

void FaultInjectingPread::WaitUntilNoneStalled() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](FaultInjectingPread* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->stalled_ == 0;
      },
      this));
}

int FaultInjectingPread::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

ssize_t FaultInjectingPread::Pread(int fd, void* buf, size_t count,
                                   off_t offset) {
  const uint64_t begin = static_cast<uint64_t>(offset);
  const uint64_t end = begin + count;
  size_t max_bytes;
  bool stalled = false;
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
    for (Failure& f : failures_) {
      if (f.times != 0 && begin < f.end && f.begin < end) {
        if (f.times > 0) --f.times;
        errno = f.err;
        return -1;
      }
    }
    if (stalling_ && begin < stall_end_ && stall_begin_ < end) {
      stalled = true;
      ++stalled_;
      ++waiting_;
      mu_.Await(absl::Condition(
          +[](FaultInjectingPread* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
               self->mu_) { return !self->stalling_; },
          this));
      --waiting_;
    }
    max_bytes = max_bytes_;
  }
  ssize_t n = ::pread(fd, buf, count, offset);
  const int saved_errno = errno;
  if (n > 0 && max_bytes > 0 && static_cast<size_t>(n) > max_bytes) {
    std::memset(static_cast<uint8_t*>(buf) + max_bytes, 0xEE,
                static_cast<size_t>(n) - max_bytes);
    n = static_cast<ssize_t>(max_bytes);
  }
  if (stalled) {
    absl::MutexLock lock(&mu_);
    --stalled_;
  }
  errno = saved_errno;
  return n;
}

}  // namespace mneme::engram::testing
