#ifndef MNEME_ENGRAM_STORE_CACHE_S3_FIFO_POLICY_H_
#define MNEME_ENGRAM_STORE_CACHE_S3_FIFO_POLICY_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engram_store/cache/tag_table.h"

namespace mneme::engram {

struct S3FifoOptions {
  // Entries the policy manages: slots 0 .. capacity - 1. Required, in
  // [1, 2^31].
  uint32_t capacity = 0;
  // Share of `capacity` the small (probation) FIFO aims at:
  // small target = max(1, floor(capacity * small_fraction)). In (0, 1).
  // Default: 0.1, the paper's value.
  double small_fraction = 0.1;
  // Ghost entries remembered, as a share of `capacity`:
  // floor(capacity * ghost_fraction). In [0, 4]. Default: 0.9 (the size of
  // the main FIFO, as in the paper).
  double ghost_fraction = 0.9;
  // Hits an entry needs while in the small FIFO to move to the main FIFO
  // when it reaches the small FIFO's tail (otherwise it is evicted and
  // remembered in the ghost FIFO). In [1, 3]. Default: 1.
  int promote_threshold = 1;
};

// The S3-FIFO eviction policy ("FIFO queues are all you need for cache
// eviction", SOSP'23) over a fixed set of slots, with no storage and no I/O:
// the cache owns the keys and the payload and asks the policy which slot a
// new entry goes to.
//
// - New entries go to the small FIFO S (~10%), or to the main FIFO M when
//   their fingerprint is in the ghost FIFO G (evicted from S recently).
//   While the cache is first filling, entries beyond S's target go to M.
// - A hit only bumps a 2-bit frequency (0..3); nothing moves.
// - When full, an admission evicts one entry: from S if M is within its
//   target and S is not empty, else from M.
//   * S tail: frequency >= promote_threshold -> moved to M's head with
//     frequency 0; otherwise evicted and its fingerprint pushed into G.
//   * M tail: frequency > 0 -> reinserted at M's head with frequency - 1;
//     otherwise evicted.
// - G is a FIFO of fingerprints with a fixed number of entries; a ghost hit
//   consumes the entry.
// This follows libCacheSim's S3FIFO (the authors' reference implementation),
// including its filling-phase variant. Why S3-FIFO: hits cost one relaxed
// byte store (no list splicing, so lookups share a lock), and on Zipf traces
// it beats LRU at equal capacity by up to 10 points of hit ratio, more with
// one-hit wonders mixed in (tests/engram_store/cache/hit_ratio_test.cc).
//
// Fingerprints are the caller's 32-bit hashes of keys (equal keys, equal
// fingerprints); only the ghost uses them, and a collision there merely
// admits an entry straight to M.
//
// Slots are handed out in increasing order (0, 1, 2, ...) until all
// `capacity` slots are in use; after that only evicted slots are reused, so
// the caller can allocate slot storage lazily.
//
// Thread-safety: Touch() may run concurrently with Touch() and the const
// observers (frequencies are relaxed atomics); Admit() needs exclusive access.
class S3FifoPolicy {
 public:
  enum class Queue : uint8_t { kFree = 0, kSmall = 1, kMain = 2 };

  struct Admission {
    // The slot the new entry occupies.
    uint32_t slot = 0;
    // Whether `slot` held an entry that was evicted for this admission (the
    // caller drops that entry's key and payload).
    bool evicted = false;
  };

  // InvalidArgument naming the field for bad options.
  static absl::StatusOr<std::unique_ptr<S3FifoPolicy>> Create(
      const S3FifoOptions& options);

  S3FifoPolicy(const S3FifoPolicy&) = delete;
  S3FifoPolicy& operator=(const S3FifoPolicy&) = delete;

  // Heap and object bytes a policy with these (valid) options uses.
  static uint64_t MemoryBytes(const S3FifoOptions& options);

  // Records a hit on the resident entry in `slot`.
  void Touch(uint32_t slot) {
    std::atomic<uint8_t>& f = freq_[slot];
    const uint8_t v = f.load(std::memory_order_relaxed);
    if (v < kMaxFrequency) f.store(v + 1, std::memory_order_relaxed);
  }

  // Admits a new entry (which must not be resident) with `fingerprint`,
  // evicting one entry when all slots are in use.
  Admission Admit(uint32_t fingerprint);

  // Observers (for tests and metrics).
  Queue QueueOf(uint32_t slot) const { return queue_[slot]; }
  int FrequencyOf(uint32_t slot) const {
    return freq_[slot].load(std::memory_order_relaxed);
  }
  bool InGhost(uint32_t fingerprint) const;
  uint32_t capacity() const { return capacity_; }
  uint32_t size() const { return small_.count + main_.count; }
  uint32_t small_size() const { return small_.count; }
  uint32_t main_size() const { return main_.count; }
  uint32_t ghost_size() const {
    return ghost_index_ == nullptr ? 0 : ghost_index_->size();
  }
  uint32_t small_target() const { return small_target_; }
  uint32_t ghost_capacity() const { return ghost_capacity_; }
  uint64_t memory_bytes() const { return memory_bytes_; }

 private:
  static constexpr uint8_t kMaxFrequency = 3;
  static constexpr double kGhostIndexLoad = 0.7;

  // A fixed-capacity FIFO of slot ids: push at the head, pop at the tail.
  struct Ring {
    std::unique_ptr<uint32_t[]> data;
    uint32_t capacity = 0;
    uint32_t tail = 0;
    uint32_t count = 0;
    void Push(uint32_t v) {
      uint64_t i = uint64_t{tail} + count;
      if (i >= capacity) i -= capacity;
      data[i] = v;
      ++count;
    }
    uint32_t Pop() {
      const uint32_t v = data[tail];
      if (++tail == capacity) tail = 0;
      --count;
      return v;
    }
  };

  explicit S3FifoPolicy(const S3FifoOptions& options);

  // Evicts one entry and returns its slot (now kFree).
  uint32_t Evict();
  // Evicts from S (promoting accessed entries to M) or returns false when S
  // ran empty without an eviction.
  bool EvictSmall(uint32_t* slot);
  uint32_t EvictMain();
  void GhostPush(uint32_t fingerprint);
  // Removes `fingerprint` from G; true if it was there.
  bool GhostTake(uint32_t fingerprint);

  const uint32_t capacity_;
  const uint32_t small_target_;
  const uint32_t main_target_;
  const uint8_t promote_threshold_;
  const uint32_t ghost_capacity_;
  const uint64_t memory_bytes_;

  uint32_t next_fresh_ = 0;
  bool has_evicted_ = false;
  std::unique_ptr<std::atomic<uint8_t>[]> freq_;
  std::unique_ptr<Queue[]> queue_;
  std::unique_ptr<uint32_t[]> fingerprint_;
  Ring small_;
  Ring main_;
  // G: ring of fingerprints (positions overwritten in FIFO order) and an
  // index fingerprint -> position of its live entry.
  std::unique_ptr<uint32_t[]> ghost_ring_;
  uint32_t ghost_next_ = 0;
  uint32_t ghost_filled_ = 0;
  std::unique_ptr<TagTable> ghost_index_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_S3_FIFO_POLICY_H_
