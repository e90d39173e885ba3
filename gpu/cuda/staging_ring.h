#ifndef MNEME_GPU_CUDA_STAGING_RING_H_
#define MNEME_GPU_CUDA_STAGING_RING_H_

// Where the next host-to-device copy is staged in a fixed block of pinned
// host memory used as a ring: each copy takes the bytes after the previous
// one (wrapping to the start when the rest of the block is too short), after
// waiting for the copies that last used those bytes. A copy from pinned
// memory is truly asynchronous, where one from pageable memory first waits
// for the stream's queued work; the ring makes every small upload of the
// CUDA backend (staged indices, Engram rows) a queued copy.
//
// Only offsets and fences here: the executor owns the memory and the
// events, so this logic is tested on the host.
//
// Thread-compatible.

#include <cstdint>
#include <deque>
#include <functional>

namespace mneme::gpu {

class StagingRing {
 public:
  // Offsets are multiples of this many bytes.
  static constexpr int64_t kAlignment = 256;

  // A ring of `capacity` bytes (> 0, rounded down to kAlignment).
  explicit StagingRing(int64_t capacity);

  int64_t capacity() const { return capacity_; }

  // Whether a copy of `bytes` can be staged here at all (else the caller
  // copies without the ring).
  bool Fits(int64_t bytes) const;

  // The offset of `bytes` (0 < bytes, Fits) for a copy whose completion
  // `fence` will mark. First calls `wait` for each earlier copy that used
  // any of these bytes (and, on a wrap, those in the skipped tail), oldest
  // first; their fences are then forgotten.
  int64_t Reserve(int64_t bytes, uint64_t fence,
                  const std::function<void(uint64_t)>& wait);

  // Calls `wait` for the oldest copy in flight, if any, and forgets it (to
  // bound the fences in flight).
  void WaitOldest(const std::function<void(uint64_t)>& wait);

  // Calls `wait` for every copy still in flight, oldest first, and empties
  // the ring.
  void Drain(const std::function<void(uint64_t)>& wait);

  // Copies staged and not yet waited for.
  int64_t in_flight() const { return static_cast<int64_t>(live_.size()); }

 private:
  struct Entry {
    int64_t offset;
    int64_t bytes;
    uint64_t fence;
  };

  int64_t capacity_;
  int64_t head_ = 0;        // Where the next copy goes when it fits.
  std::deque<Entry> live_;  // Oldest first.
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_STAGING_RING_H_
