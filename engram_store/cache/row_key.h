#ifndef MNEME_ENGRAM_STORE_CACHE_ROW_KEY_H_
#define MNEME_ENGRAM_STORE_CACHE_ROW_KEY_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace mneme::engram {

// Helpers shared by the row cache tiers: the packed 64-bit key of a row
// (table id in the top 16 bits, row id in the low 48) and its hash.

// Packs a key. Requires table <= kMaxRowCacheTableId and
// 0 <= row <= kMaxRowCacheRowId (see ValidateRowCacheArgs).
constexpr uint64_t PackRowKey(uint32_t table, int64_t row) {
  return (static_cast<uint64_t>(table) << 48) | static_cast<uint64_t>(row);
}

// The murmur3 64-bit finalizer: a bijective mix whose every output bit
// depends on every input bit. Deterministic across processes, unlike
// absl::Hash, so eviction order is reproducible.
constexpr uint64_t MixRowKey(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ULL;
  key ^= key >> 33;
  return key;
}

// Checks the arguments every RowCache batch call shares: `table` and every
// id in range, and `payload_bytes` == ids.size() * row_bytes.
// InvalidArgument naming the first problem otherwise.
absl::Status ValidateRowCacheArgs(uint32_t table, absl::Span<const int64_t> ids,
                                  size_t payload_bytes, size_t row_bytes);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CACHE_ROW_KEY_H_
