#include "gpu/cuda/staging_ring.h"

#include <cstdint>
#include <functional>

#include "glog/logging.h"

namespace mneme::gpu {
namespace {

int64_t RoundUp(int64_t bytes) {
  return (bytes + StagingRing::kAlignment - 1) / StagingRing::kAlignment *
         StagingRing::kAlignment;
}

}  // namespace

StagingRing::StagingRing(int64_t capacity)
    : capacity_(capacity / kAlignment * kAlignment) {
  CHECK_GT(capacity_, 0) << "a staging ring of " << capacity << " bytes";
}

bool StagingRing::Fits(int64_t bytes) const {
  return bytes > 0 && RoundUp(bytes) <= capacity_;
}

int64_t StagingRing::Reserve(int64_t bytes, uint64_t fence,
                             const std::function<void(uint64_t)>& wait) {
  CHECK(Fits(bytes)) << bytes << " bytes in a ring of " << capacity_;
  const int64_t n = RoundUp(bytes);
  const bool wrap = head_ + n > capacity_;
  const int64_t start = wrap ? 0 : head_;
  // Live copies lie in ring order from the oldest to head_, so the ones in
  // the way are always the oldest: on a wrap, those in the skipped tail
  // [head_, capacity_) and then those that start before n; otherwise those
  // that start inside [head_, head_ + n).
  while (!live_.empty()) {
    const Entry& e = live_.front();
    const bool in_way = wrap ? (e.offset >= head_ || e.offset < n)
                             : (e.offset >= start && e.offset < start + n);
    if (!in_way) break;
    wait(e.fence);
    live_.pop_front();
  }
  live_.push_back(Entry{.offset = start, .bytes = n, .fence = fence});
  head_ = start + n;
  return start;
}

void StagingRing::WaitOldest(const std::function<void(uint64_t)>& wait) {
  if (live_.empty()) return;
  wait(live_.front().fence);
  live_.pop_front();
}

void StagingRing::Drain(const std::function<void(uint64_t)>& wait) {
  while (!live_.empty()) {
    wait(live_.front().fence);
    live_.pop_front();
  }
  head_ = 0;
}

}  // namespace mneme::gpu
