#include "engram_store/cache/tag_table.h"

#include <algorithm>
#include <cmath>

#include "glog/logging.h"

namespace mneme::engram {

uint32_t TagTable::NumBuckets(uint32_t max_entries, double max_load) {
  CHECK(max_load > 0 && max_load < 1) << "max_load " << max_load;
  CHECK_LT(max_entries, 0xFFFFFFFEu);
  // At least one bucket stays empty, so every probe ends.
  const double wanted = std::ceil(static_cast<double>(max_entries) / max_load);
  const double n = std::max(wanted, static_cast<double>(max_entries) + 1);
  CHECK_LE(n, 4294967295.0) << "too many entries for a TagTable";
  return static_cast<uint32_t>(n);
}

uint64_t TagTable::MemoryBytes(uint32_t max_entries, double max_load) {
  return uint64_t{NumBuckets(max_entries, max_load)} * 8;
}

TagTable::TagTable(uint32_t max_entries, double max_load)
    : max_entries_(max_entries),
      num_buckets_(NumBuckets(max_entries, max_load)),
      buckets_(static_cast<uint64_t*>(std::calloc(num_buckets_, 8))) {
  CHECK(buckets_ != nullptr)
      << "TagTable: cannot allocate " << num_buckets_ << " buckets";
}

void TagTable::Insert(uint32_t hash, uint32_t value) {
  DCHECK_LT(size_, max_entries_);
  DCHECK_NE(value, kNotFound);
  uint32_t i = Home(hash);
  while (buckets_[i] != 0) {
    if (++i == num_buckets_) {
      i = 0;
    }
  }
  buckets_[i] = (uint64_t{hash} << 32) | (uint64_t{value} + 1);
  ++size_;
}

bool TagTable::Erase(uint32_t hash, uint32_t value) {
  const uint64_t wanted = (uint64_t{hash} << 32) | (uint64_t{value} + 1);
  uint32_t i = Home(hash);
  while (buckets_[i] != wanted) {
    if (buckets_[i] == 0) {
      return false;
    }
    if (++i == num_buckets_) {
      i = 0;
    }
  }
  // Backward shift: move later entries of the cluster into the hole unless
  // their home lies cyclically in (hole, j].
  uint32_t j = i;
  while (true) {
    if (++j == num_buckets_) {
      j = 0;
    }
    const uint64_t b = buckets_[j];
    if (b == 0) {
      break;
    }
    const uint32_t home = Home(static_cast<uint32_t>(b >> 32));
    const bool stays =
        i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) {
      continue;
    }
    buckets_[i] = b;
    i = j;
  }
  buckets_[i] = 0;
  --size_;
  return true;
}

}  // namespace mneme::engram
