#include "model/kv_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(
    const KvCacheOptions& options, int64_t row_floats, gpu::Backend& backend) {
  if (options.block_rows < 1 || options.block_rows > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache block_rows=", options.block_rows, " must be in [1, 4096]"));
  }
  if (row_floats < 1) {
    return absl::InvalidArgumentError("kv cache rows must have >= 1 float");
  }
  const int64_t block_bytes = int64_t{options.block_rows} * row_floats * 4;
  const int64_t blocks = options.budget_bytes / block_bytes;
  if (blocks < 1 || blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache budget_bytes=", options.budget_bytes,
        " must hold between 1 and 2^30 blocks of ", block_bytes, " bytes"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> pool,
                   backend.Allocate(blocks * options.block_rows * row_floats));
  return std::unique_ptr<KvCache>(new KvCache(options.block_rows, row_floats,
                                              static_cast<int>(blocks),
                                              std::move(pool)));
}

KvCache::KvCache(int block_rows, int64_t row_floats, int num_blocks,
                 std::unique_ptr<gpu::Buffer> pool)
    : block_rows_(block_rows),
      row_floats_(row_floats),
      num_blocks_(num_blocks),
      pool_(std::move(pool)) {
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::Status KvCache::Allocate(int count, std::vector<int32_t>& blocks) {
  if (count < 0 || count > static_cast<int>(free_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache full: ", count, " blocks wanted, ", free_.size(),
                     " of ", num_blocks_, " free"));
  }
  for (int i = 0; i < count; ++i) {
    blocks.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void KvCache::Free(std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) free_.push_back(b);
  blocks.clear();
}

}  // namespace mneme::model
