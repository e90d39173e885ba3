#include "engram_store/cache/row_key.h"

#include "absl/strings/str_cat.h"
#include "engram_store/cache/row_cache.h"

namespace mneme::engram {

absl::Status ValidateRowCacheArgs(uint32_t table, absl::Span<const int64_t> ids,
                                  size_t payload_bytes, size_t row_bytes) {
  if (table > kMaxRowCacheTableId) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row cache: table id ", table, " > ", kMaxRowCacheTableId));
  }
  if (payload_bytes != ids.size() * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("row cache: buffer of ", payload_bytes, " bytes for ",
                     ids.size(), " rows of ", row_bytes, " bytes"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > kMaxRowCacheRowId) {
      return absl::InvalidArgumentError(
          absl::StrCat("row cache: row id ", ids[i], " (index ", i,
                       ") outside [0, ", kMaxRowCacheRowId, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::engram
