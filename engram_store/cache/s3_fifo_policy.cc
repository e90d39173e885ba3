#include "engram_store/cache/s3_fifo_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mneme::engram {
namespace {

uint32_t SmallTarget(const S3FifoOptions& options) {
  const double t = std::floor(options.capacity * options.small_fraction);
  return std::max<uint32_t>(1, static_cast<uint32_t>(t));
}

uint32_t GhostCapacity(const S3FifoOptions& options) {
  return static_cast<uint32_t>(
      std::floor(options.capacity * options.ghost_fraction));
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3FifoPolicy>> S3FifoPolicy::Create(
    const S3FifoOptions& options) {
  if (options.capacity < 1 || options.capacity > (1u << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3FifoOptions.capacity must be in [1, 2^31], got ", options.capacity));
  }
  if (!(options.small_fraction > 0 && options.small_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3FifoOptions.small_fraction must be in (0, 1), got ",
                     options.small_fraction));
  }
  if (!(options.ghost_fraction >= 0 && options.ghost_fraction <= 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3FifoOptions.ghost_fraction must be in [0, 4], got ",
                     options.ghost_fraction));
  }
  if (options.promote_threshold < 1 ||
      options.promote_threshold > kMaxFrequency) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3FifoOptions.promote_threshold must be in [1, 3], got ",
                     options.promote_threshold));
  }
  return std::unique_ptr<S3FifoPolicy>(new S3FifoPolicy(options));
}

uint64_t S3FifoPolicy::MemoryBytes(const S3FifoOptions& options) {
  const uint64_t n = options.capacity;
  const uint32_t g = GhostCapacity(options);
  uint64_t bytes = sizeof(S3FifoPolicy);
  bytes += n * (sizeof(std::atomic<uint8_t>) + sizeof(Queue) +
                sizeof(uint32_t) /* fingerprint */ +
                2 * sizeof(uint32_t) /* rings */);
  if (g > 0) {
    bytes += uint64_t{g} * sizeof(uint32_t) + sizeof(TagTable) +
             TagTable::MemoryBytes(g, kGhostIndexLoad);
  }
  return bytes;
}

S3FifoPolicy::S3FifoPolicy(const S3FifoOptions& options)
    : capacity_(options.capacity),
      small_target_(SmallTarget(options)),
      main_target_(capacity_ - std::min(small_target_, capacity_)),
      promote_threshold_(static_cast<uint8_t>(options.promote_threshold)),
      ghost_capacity_(GhostCapacity(options)),
      memory_bytes_(MemoryBytes(options)),
      freq_(new std::atomic<uint8_t>[capacity_]),
      queue_(new Queue[capacity_]),
      fingerprint_(new uint32_t[capacity_]) {
  std::fill_n(queue_.get(), capacity_, Queue::kFree);
  small_.data.reset(new uint32_t[capacity_]);
  small_.capacity = capacity_;
  main_.data.reset(new uint32_t[capacity_]);
  main_.capacity = capacity_;
  if (ghost_capacity_ > 0) {
    ghost_ring_.reset(new uint32_t[ghost_capacity_]);
    ghost_index_ = std::make_unique<TagTable>(ghost_capacity_, kGhostIndexLoad);
  }
}

S3FifoPolicy::Admission S3FifoPolicy::Admit(uint32_t fingerprint) {
  const bool ghost_hit = GhostTake(fingerprint);
  Admission admission;
  if (next_fresh_ < capacity_) {
    admission.slot = next_fresh_++;
  } else {
    admission.slot = Evict();
    admission.evicted = true;
    has_evicted_ = true;
  }
  const uint32_t slot = admission.slot;
  fingerprint_[slot] = fingerprint;
  freq_[slot].store(0, std::memory_order_relaxed);
  if (ghost_hit || (!has_evicted_ && small_.count >= small_target_)) {
    queue_[slot] = Queue::kMain;
    main_.Push(slot);
  } else {
    queue_[slot] = Queue::kSmall;
    small_.Push(slot);
  }
  return admission;
}

uint32_t S3FifoPolicy::Evict() {
  while (true) {
    if (main_.count > main_target_ || small_.count == 0) {
      return EvictMain();
    }
    uint32_t slot;
    if (EvictSmall(&slot)) {
      return slot;
    }
  }
}

bool S3FifoPolicy::EvictSmall(uint32_t* slot) {
  while (small_.count > 0) {
    const uint32_t t = small_.Pop();
    if (freq_[t].load(std::memory_order_relaxed) >= promote_threshold_) {
      freq_[t].store(0, std::memory_order_relaxed);
      queue_[t] = Queue::kMain;
      main_.Push(t);
      continue;
    }
    queue_[t] = Queue::kFree;
    GhostPush(fingerprint_[t]);
    *slot = t;
    return true;
  }
  return false;
}

uint32_t S3FifoPolicy::EvictMain() {
  // Terminates: every reinsertion lowers a frequency and nothing raises one
  // meanwhile (Admit has exclusive access).
  DCHECK_GT(main_.count, 0u);
  while (true) {
    const uint32_t t = main_.Pop();
    const uint8_t f = freq_[t].load(std::memory_order_relaxed);
    if (f > 0) {
      freq_[t].store(std::min<uint8_t>(f, kMaxFrequency) - 1,
                     std::memory_order_relaxed);
      main_.Push(t);
      continue;
    }
    queue_[t] = Queue::kFree;
    return t;
  }
}

void S3FifoPolicy::GhostPush(uint32_t fingerprint) {
  if (ghost_capacity_ == 0) {
    return;
  }
  // A fingerprint lives at most once in G (a collision refreshes it).
  GhostTake(fingerprint);
  const uint32_t pos = ghost_next_;
  if (ghost_filled_ == ghost_capacity_) {
    // Overwriting the oldest position; its fingerprint may already be gone
    // (taken by a ghost hit, or refreshed elsewhere): then Erase is a no-op.
    ghost_index_->Erase(ghost_ring_[pos], pos);
  } else {
    ++ghost_filled_;
  }
  ghost_ring_[pos] = fingerprint;
  ghost_index_->Insert(fingerprint, pos);
  ghost_next_ = pos + 1 == ghost_capacity_ ? 0 : pos + 1;
}

bool S3FifoPolicy::GhostTake(uint32_t fingerprint) {
  if (ghost_capacity_ == 0) {
    return false;
  }
  const uint32_t pos =
      ghost_index_->Find(fingerprint, [](uint32_t) { return true; });
  if (pos == TagTable::kNotFound) {
    return false;
  }
  ghost_index_->Erase(fingerprint, pos);
  return true;
}

bool S3FifoPolicy::InGhost(uint32_t fingerprint) const {
  if (ghost_capacity_ == 0) {
    return false;
  }
  return ghost_index_->Find(fingerprint, [](uint32_t) { return true; }) !=
         TagTable::kNotFound;
}

}  // namespace mneme::engram
