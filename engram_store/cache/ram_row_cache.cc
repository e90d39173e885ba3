#include "engram_store/cache/ram_row_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "engram_store/cache/row_key.h"
#include "engram_store/cache/s3_fifo_policy.h"
#include "engram_store/cache/tag_table.h"
#include "glog/logging.h"

namespace mneme::engram {
namespace {

// Index buckets per row at full capacity: 1 / kIndexLoad.
constexpr double kIndexLoad = 0.7;
// Rows of an insert batch grouped (and a shard's lock held for) at a time.
constexpr size_t kChunkRows = 512;
// Rows of a lookup batch for which the shards' reader locks are held
// together (bounds how long a lookup can delay an insert: ~40 us).
constexpr size_t kLookupChunkRows = 256;
constexpr int kMaxShards = 1024;
constexpr size_t kMaxRowBytes = 65536;
constexpr size_t kKeyBytes = sizeof(uint64_t);
// Rows whose slots are prefetched together before they are copied.
constexpr uint32_t kPrefetchWindow = 32;

S3FifoOptions PolicyOptions(const RamRowCacheOptions& options,
                            uint32_t capacity) {
  S3FifoOptions p;
  p.capacity = capacity;
  p.small_fraction = options.small_queue_fraction;
  p.ghost_fraction = options.ghost_fraction;
  return p;
}

uint32_t IndexHash(uint64_t mixed) { return static_cast<uint32_t>(mixed); }

uint64_t LoadKey(const uint8_t* slot) {
  uint64_t key;
  std::memcpy(&key, slot, kKeyBytes);
  return key;
}

}  // namespace

struct alignas(64) RamRowCache::Shard {
  mutable absl::Mutex mu;
  // Set once at construction; the objects are guarded by `mu`
  // (S3FifoPolicy::Touch is safe under a shared lock).
  std::unique_ptr<S3FifoPolicy> policy ABSL_PT_GUARDED_BY(mu);
  std::unique_ptr<TagTable> index ABSL_PT_GUARDED_BY(mu);
  // Sized at Create (one entry per slab); entries allocated as filled.
  std::vector<std::unique_ptr<uint8_t[]>> slabs ABSL_GUARDED_BY(mu);
  // Bytes of this object, the policy, the index and `slabs`' array.
  uint64_t metadata_bytes = 0;
  std::atomic<uint64_t> slab_bytes{0};
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> inserts{0};
  std::atomic<uint64_t> evictions{0};
};

struct RamRowCache::Grouping {
  uint64_t key[kChunkRows];
  uint32_t hash[kChunkRows];
  uint16_t shard[kChunkRows];
  // Positions in the chunk grouped by shard: shard s owns
  // order[start[s] .. start[s + 1]).
  uint16_t order[kChunkRows];
  uint32_t start[kMaxShards + 1];
};

uint64_t RamRowCache::ShardBytes(const RamRowCacheOptions& options,
                                 size_t slot_bytes, int slab_shift,
                                 uint32_t rows) {
  const uint64_t slots_per_slab = uint64_t{1} << slab_shift;
  const uint64_t num_slabs = (rows + slots_per_slab - 1) / slots_per_slab;
  return sizeof(Shard) +
         S3FifoPolicy::MemoryBytes(PolicyOptions(options, rows)) +
         sizeof(TagTable) + TagTable::MemoryBytes(rows, kIndexLoad) +
         num_slabs * sizeof(std::unique_ptr<uint8_t[]>) +
         uint64_t{rows} * slot_bytes;
}

absl::StatusOr<std::unique_ptr<RamRowCache>> RamRowCache::Create(
    const RamRowCacheOptions& options) {
  if (options.row_bytes < 1 || options.row_bytes > kMaxRowBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("RamRowCacheOptions.row_bytes must be in [1, ",
                     kMaxRowBytes, "], got ", options.row_bytes));
  }
  if (options.num_shards < 1 || options.num_shards > kMaxShards ||
      (options.num_shards & (options.num_shards - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RamRowCacheOptions.num_shards must be a power of two in [1, ",
        kMaxShards, "], got ", options.num_shards));
  }
  if (!(options.small_queue_fraction > 0 && options.small_queue_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RamRowCacheOptions.small_queue_fraction must be in (0, 1), got ",
        options.small_queue_fraction));
  }
  if (!(options.ghost_fraction >= 0 && options.ghost_fraction <= 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RamRowCacheOptions.ghost_fraction must be in [0, 4], "
                     "got ",
                     options.ghost_fraction));
  }
  if (options.slab_bytes < 4096 || options.slab_bytes > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RamRowCacheOptions.slab_bytes must be in [4096, 2^30], got ",
        options.slab_bytes));
  }
  const size_t slot_bytes = (kKeyBytes + options.row_bytes + 7) / 8 * 8;
  int slab_shift = 0;
  while ((size_t{2} << slab_shift) * slot_bytes <= options.slab_bytes) {
    ++slab_shift;
  }
  int shard_bits = 0;
  while ((1 << shard_bits) < options.num_shards) {
    ++shard_bits;
  }

  // The largest per-shard row count that fits the budget (ShardBytes grows
  // with rows).
  const auto total = [&](uint32_t rows) {
    return sizeof(RamRowCache) +
           static_cast<uint64_t>(options.num_shards) *
               ShardBytes(options, slot_bytes, slab_shift, rows);
  };
  if (total(1) > options.budget_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RamRowCacheOptions.budget_bytes ", options.budget_bytes,
        " is too small: one row per shard (num_shards = ", options.num_shards,
        ") needs ", total(1)));
  }
  uint64_t lo = 1;
  uint64_t hi = std::min<uint64_t>(
      uint64_t{1} << 31,
      options.budget_bytes / options.num_shards / slot_bytes + 1);
  while (lo < hi) {  // invariant: total(lo) fits
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (total(static_cast<uint32_t>(mid)) <= options.budget_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const auto rows_per_shard = static_cast<uint32_t>(lo);
  return std::unique_ptr<RamRowCache>(new RamRowCache(
      options, shard_bits, rows_per_shard, slot_bytes, slab_shift));
}

RamRowCache::RamRowCache(const RamRowCacheOptions& options, int shard_bits,
                         uint32_t rows_per_shard, size_t slot_bytes,
                         int slab_shift)
    : options_(options),
      shard_bits_(shard_bits),
      rows_per_shard_(rows_per_shard),
      capacity_rows_(uint64_t{rows_per_shard} * options.num_shards),
      slot_bytes_(slot_bytes),
      slab_shift_(slab_shift),
      shards_(new Shard[options.num_shards]) {
  const uint64_t slots_per_slab = uint64_t{1} << slab_shift_;
  const uint64_t num_slabs =
      (rows_per_shard_ + slots_per_slab - 1) / slots_per_slab;
  for (int s = 0; s < options_.num_shards; ++s) {
    Shard& shard = shards_[s];
    absl::StatusOr<std::unique_ptr<S3FifoPolicy>> policy =
        S3FifoPolicy::Create(PolicyOptions(options_, rows_per_shard_));
    // Options were validated by Create().
    CHECK(policy.ok()) << policy.status();
    shard.policy = *std::move(policy);
    shard.index = std::make_unique<TagTable>(rows_per_shard_, kIndexLoad);
    absl::MutexLock lock(&shard.mu);
    shard.slabs.resize(num_slabs);
    shard.metadata_bytes =
        ShardBytes(options_, slot_bytes_, slab_shift_, rows_per_shard_) -
        uint64_t{rows_per_shard_} * slot_bytes_;
  }
}

RamRowCache::~RamRowCache() = default;

inline uint8_t* RamRowCache::SlotAddress(const Shard& shard,
                                         uint32_t slot) const {
  const uint32_t mask = (uint32_t{1} << slab_shift_) - 1;
  return shard.slabs[slot >> slab_shift_].get() +
         size_t{slot & mask} * slot_bytes_;
}

void RamRowCache::Group(uint32_t table, absl::Span<const int64_t> ids,
                        size_t begin, size_t count, Grouping* g) const {
  const int num_shards = options_.num_shards;
  std::fill_n(g->start, num_shards + 1, 0);
  for (size_t p = 0; p < count; ++p) {
    const uint64_t key = PackRowKey(table, ids[begin + p]);
    const uint64_t mixed = MixRowKey(key);
    g->key[p] = key;
    g->hash[p] = IndexHash(mixed);
    const uint16_t s = shard_bits_ == 0
                           ? 0
                           : static_cast<uint16_t>(mixed >> (64 - shard_bits_));
    g->shard[p] = s;
    ++g->start[s + 1];
  }
  for (int s = 0; s < num_shards; ++s) {
    g->start[s + 1] += g->start[s];
  }
  uint32_t fill[kMaxShards];
  std::copy_n(g->start, num_shards, fill);
  for (size_t p = 0; p < count; ++p) {
    g->order[fill[g->shard[p]]++] = static_cast<uint16_t>(p);
  }
}

void RamRowCache::PrefetchBuckets(const Grouping& g, size_t count) const {
  for (size_t p = 0; p < count; ++p) {
    __builtin_prefetch(shards_[g.shard[p]].index->BucketAddress(g.hash[p]));
  }
}

size_t RamRowCache::LookupChunk(const Grouping& g, size_t begin, size_t count,
                                uint8_t* dst, std::vector<bool>* hits) const {
  const int num_shards = options_.num_shards;
  // Reader locks of every shard the chunk touches, in increasing order.
  // Deadlock-free: lookups are the only holders of several locks and all
  // take them in that order; inserts hold one lock at a time.
  for (int s = 0; s < num_shards; ++s) {
    if (g.start[s] != g.start[s + 1]) {
      shards_[s].mu.ReaderLock();
    }
  }
  uint32_t shard_hits[kMaxShards];
  std::fill_n(shard_hits, num_shards, 0);
  const size_t row_bytes = options_.row_bytes;
  size_t total_hits = 0;
  // In windows of rows, in the caller's order (all locks are held): first
  // resolve each row's first candidate slot and prefetch it, then verify
  // and copy, so that the misses of a window overlap across shards.
  for (size_t w = 0; w < count; w += kPrefetchWindow) {
    const size_t w_end = std::min(count, w + kPrefetchWindow);
    for (size_t p = w; p < w_end; ++p) {
      const Shard& shard = shards_[g.shard[p]];
      const uint32_t candidate =
          shard.index->Find(g.hash[p], [](uint32_t) { return true; });
      if (candidate == TagTable::kNotFound) {
        continue;
      }
      const uint8_t* address = SlotAddress(shard, candidate);
      for (size_t b = 0; b < slot_bytes_; b += 64) {
        __builtin_prefetch(address + b);
      }
    }
    for (size_t p = w; p < w_end; ++p) {
      const Shard& shard = shards_[g.shard[p]];
      const uint64_t key = g.key[p];
      const uint32_t slot =
          shard.index->Find(g.hash[p], [&](uint32_t candidate) {
            return LoadKey(SlotAddress(shard, candidate)) == key;
          });
      if (slot == TagTable::kNotFound) {
        continue;
      }
      std::memcpy(dst + (begin + p) * row_bytes,
                  SlotAddress(shard, slot) + kKeyBytes, row_bytes);
      shard.policy->Touch(slot);
      (*hits)[begin + p] = true;
      ++shard_hits[g.shard[p]];
      ++total_hits;
    }
  }
  for (int s = 0; s < num_shards; ++s) {
    const uint32_t rows = g.start[s + 1] - g.start[s];
    if (rows == 0) {
      continue;
    }
    shards_[s].mu.ReaderUnlock();
    shards_[s].hits.fetch_add(shard_hits[s], std::memory_order_relaxed);
    shards_[s].misses.fetch_add(rows - shard_hits[s],
                                std::memory_order_relaxed);
  }
  return total_hits;
}

absl::StatusOr<size_t> RamRowCache::LookupBatch(uint32_t table,
                                                absl::Span<const int64_t> ids,
                                                absl::Span<uint8_t> dst,
                                                std::vector<bool>* hits) {
  if (hits == nullptr) {
    return absl::InvalidArgumentError("row cache: hits is null");
  }
  RETURN_IF_ERROR(
      ValidateRowCacheArgs(table, ids, dst.size(), options_.row_bytes));
  hits->assign(ids.size(), false);
  size_t total_hits = 0;
  Grouping g;
  for (size_t begin = 0; begin < ids.size(); begin += kLookupChunkRows) {
    const size_t count = std::min(kLookupChunkRows, ids.size() - begin);
    Group(table, ids, begin, count, &g);
    PrefetchBuckets(g, count);
    total_hits += LookupChunk(g, begin, count, dst.data(), hits);
  }
  return total_hits;
}

absl::Status RamRowCache::InsertBatch(uint32_t table,
                                      absl::Span<const int64_t> ids,
                                      absl::Span<const uint8_t> rows) {
  RETURN_IF_ERROR(
      ValidateRowCacheArgs(table, ids, rows.size(), options_.row_bytes));
  const size_t row_bytes = options_.row_bytes;
  const uint32_t slots_per_slab = uint32_t{1} << slab_shift_;
  Grouping g;
  for (size_t begin = 0; begin < ids.size(); begin += kChunkRows) {
    const size_t count = std::min(kChunkRows, ids.size() - begin);
    Group(table, ids, begin, count, &g);
    for (int s = 0; s < options_.num_shards; ++s) {
      const uint32_t first = g.start[s];
      const uint32_t last = g.start[s + 1];
      if (first == last) {
        continue;
      }
      Shard& shard = shards_[s];
      uint64_t evicted = 0;
      uint64_t new_slab_bytes = 0;
      {
        absl::MutexLock lock(&shard.mu);
        TagTable& index = *shard.index;
        for (uint32_t k = first; k < last; ++k) {
          const uint16_t p = g.order[k];
          const uint64_t key = g.key[p];
          const uint8_t* row = rows.data() + (begin + p) * row_bytes;
          uint32_t slot = index.Find(g.hash[p], [&](uint32_t candidate) {
            return LoadKey(SlotAddress(shard, candidate)) == key;
          });
          if (slot != TagTable::kNotFound) {
            std::memcpy(SlotAddress(shard, slot) + kKeyBytes, row, row_bytes);
            continue;
          }
          const S3FifoPolicy::Admission admission =
              shard.policy->Admit(g.hash[p]);
          slot = admission.slot;
          if (admission.evicted) {
            const uint64_t old_key = LoadKey(SlotAddress(shard, slot));
            const bool erased =
                index.Erase(IndexHash(MixRowKey(old_key)), slot);
            DCHECK(erased);
            ++evicted;
          }
          std::unique_ptr<uint8_t[]>& slab = shard.slabs[slot >> slab_shift_];
          if (slab == nullptr) {
            // Slots come in increasing order: this is the slab's first use.
            const uint32_t first_slot = slot & ~(slots_per_slab - 1);
            const size_t slab_slots =
                std::min(slots_per_slab, rows_per_shard_ - first_slot);
            slab.reset(new uint8_t[slab_slots * slot_bytes_]);
            new_slab_bytes += slab_slots * slot_bytes_;
          }
          uint8_t* address = SlotAddress(shard, slot);
          std::memcpy(address, &key, kKeyBytes);
          std::memcpy(address + kKeyBytes, row, row_bytes);
          index.Insert(g.hash[p], slot);
        }
      }
      shard.inserts.fetch_add(last - first, std::memory_order_relaxed);
      if (evicted > 0) {
        shard.evictions.fetch_add(evicted, std::memory_order_relaxed);
      }
      if (new_slab_bytes > 0) {
        shard.slab_bytes.fetch_add(new_slab_bytes, std::memory_order_relaxed);
      }
    }
  }
  return absl::OkStatus();
}

RowCacheStats RamRowCache::GetStats() const {
  RowCacheStats stats;
  stats.budget_bytes = options_.budget_bytes;
  stats.bytes_in_use = sizeof(RamRowCache);
  for (int s = 0; s < options_.num_shards; ++s) {
    const Shard& shard = shards_[s];
    stats.hits += shard.hits.load(std::memory_order_relaxed);
    stats.misses += shard.misses.load(std::memory_order_relaxed);
    stats.inserts += shard.inserts.load(std::memory_order_relaxed);
    stats.evictions += shard.evictions.load(std::memory_order_relaxed);
    stats.bytes_in_use +=
        shard.metadata_bytes + shard.slab_bytes.load(std::memory_order_relaxed);
    absl::ReaderMutexLock lock(&shard.mu);
    stats.entries += shard.policy->size();
  }
  stats.lookups = stats.hits + stats.misses;
  return stats;
}

}  // namespace mneme::engram
