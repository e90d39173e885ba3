#ifndef MNEME_MODEL_KV_CACHE_H_
#define MNEME_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::model {

struct KvCacheOptions {
  // Backend memory for cached entries, bytes; rounded down to whole blocks.
  // Default: 256 MiB.
  int64_t budget_bytes = int64_t{256} << 20;
  // Entries (rows of head_dim floats) per block. Default: 16.
  int block_rows = 16;
};

// A paged pool of attention entries in backend memory: fixed-size blocks of
// `block_rows` rows of `row_floats` floats each, handed out and returned
// whole. A row is addressed by (block, offset) as the pool row index
// block * block_rows + offset, which is what the backend's GatherRows and
// ScatterRows take. The pool never grows: Allocate returns ResourceExhausted
// when it is full.
//
// Thread-compatible (the worker's step loop owns it).
class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      const KvCacheOptions& options, int64_t row_floats, gpu::Backend& backend);

  // `count` free blocks, appended to `blocks`; ResourceExhausted (and
  // nothing taken) when fewer are free.
  absl::Status Allocate(int count, std::vector<int32_t>& blocks);
  // Returns blocks to the pool; `blocks` is cleared.
  void Free(std::vector<int32_t>& blocks);
  // The pool row of entry `index` of a run of entries stored in `blocks`
  // (index < blocks.size() * block_rows()).
  int32_t Row(const std::vector<int32_t>& blocks, int64_t index) const {
    return static_cast<int32_t>(blocks[index / block_rows_] * block_rows_ +
                                index % block_rows_);
  }

  // The pool as a matrix of rows (for GatherRows / ScatterRows).
  gpu::MatrixView pool() { return pool_->view(rows(), row_floats_); }
  int64_t rows() const { return int64_t{num_blocks_} * block_rows_; }
  int block_rows() const { return block_rows_; }
  int num_blocks() const { return num_blocks_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int64_t block_bytes() const { return int64_t{block_rows_} * row_floats_ * 4; }

 private:
  KvCache(int block_rows, int64_t row_floats, int num_blocks,
          std::unique_ptr<gpu::Buffer> pool);

  const int block_rows_;
  const int64_t row_floats_;
  const int num_blocks_;
  std::unique_ptr<gpu::Buffer> pool_;
  std::vector<int32_t> free_;  // A stack; lowest ids handed out first.
};

}  // namespace mneme::model

#endif  // MNEME_MODEL_KV_CACHE_H_
