#ifndef MNEME_ENGRAM_STORE_CACHE_TAG_TABLE_H_
#define MNEME_ENGRAM_STORE_CACHE_TAG_TABLE_H_

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace mneme::engram {

// A fixed-capacity open-addressing hash table of (32-bit hash, 32-bit value)
// entries: the index of the RAM row cache (hash of a key -> slot) and of its
// ghost queue (fingerprint -> ring position).
//
// Why not absl::flat_hash_map: this table is 8 bytes per bucket with a fixed
// bucket count chosen at construction, so its memory is known exactly up
// front (the cache's byte budget counts it) and never grows; deletion shifts
// entries back (linear probing, no tombstones), so probe lengths do not
// degrade under constant churn.
//
// Several entries may share a hash: lookups take a predicate on the value to
// pick the right one (the caller keeps the full keys elsewhere). The bucket
// array is calloc'ed, so untouched parts cost no resident memory.
//
// Not thread-safe; const methods may run concurrently with each other.
class TagTable {
 public:
  // Returned by Find when nothing matches; also not a storable value.
  static constexpr uint32_t kNotFound = 0xFFFFFFFFu;

  // A table for up to `max_entries` entries, with buckets sized for a load
  // of at most `max_load` (in (0, 1)) when full. CHECK-fails on bad
  // arguments or when the allocation fails.
  TagTable(uint32_t max_entries, double max_load);

  TagTable(const TagTable&) = delete;
  TagTable& operator=(const TagTable&) = delete;

  // Heap bytes a table built with these arguments allocates.
  static uint64_t MemoryBytes(uint32_t max_entries, double max_load);

  uint64_t memory_bytes() const { return uint64_t{num_buckets_} * 8; }
  uint32_t size() const { return size_; }
  uint32_t max_entries() const { return max_entries_; }

  // The value of an entry with `hash` for which match(value) is true, or
  // kNotFound.
  template <typename Match>
  uint32_t Find(uint32_t hash, Match&& match) const {
    uint32_t i = Home(hash);
    while (true) {
      const uint64_t b = buckets_[i];
      if (b == 0) return kNotFound;
      if (static_cast<uint32_t>(b >> 32) == hash) {
        const uint32_t value = static_cast<uint32_t>(b) - 1;
        if (match(value)) return value;
      }
      if (++i == num_buckets_) i = 0;
    }
  }

  // Where Find(hash, ...) starts probing; for prefetching.
  const void* BucketAddress(uint32_t hash) const {
    return &buckets_[Home(hash)];
  }

  // Adds (hash, value). Requires size() < max_entries() and
  // value != kNotFound; does not check for duplicates.
  void Insert(uint32_t hash, uint32_t value);

  // Removes the entry (hash, value); false if there is none.
  bool Erase(uint32_t hash, uint32_t value);

 private:
  struct FreeDeleter {
    void operator()(uint64_t* p) const { std::free(p); }
  };

  static uint32_t NumBuckets(uint32_t max_entries, double max_load);
  uint32_t Home(uint32_t hash) const {
    return static_cast<uint32_t>((uint64_t{hash} * num_buckets_) >> 32);
  }

  const uint32_t max_entries_;
  const uint32_t num_buckets_;
  uint32_t size_ = 0;
  // Bucket = hash << 32 | (value + 1); 0 = empty.
  std::unique_ptr<uint64_t[], FreeDeleter> buckets_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_TAG_TABLE_H_
