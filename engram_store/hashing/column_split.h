#ifndef MNEME_ENGRAM_STORE_HASHING_COLUMN_SPLIT_H_
#define MNEME_ENGRAM_STORE_HASHING_COLUMN_SPLIT_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engram_store/hashing/hash_layout.h"

namespace mneme::engram {

// How tensor-parallel ranks share the hash columns of every Engram layer
// (each rank reads its columns' rows; the rows are then all-gathered).
enum class ColumnSplit {
  kUnspecified = 0,
  // Rank r owns columns [r * C / tp, (r + 1) * C / tp): one block of the
  // table per rank, but low orders land on low ranks (at TP4 rank 0 holds
  // only 2-gram heads), which unbalances reads once rows are deduplicated.
  // Needs tp | C.
  kContiguous = 1,
  // Rank r owns the columns c with c % tp == r, which with tp | n_heads are
  // heads j = r, r + tp, ... of every order: every rank holds n_heads / tp
  // columns of each n-gram order. Needs tp | n_heads.
  kStrided = 2,
};

// "contiguous" / "strided" (the --split flag values); InvalidArgument
// naming the value otherwise.
absl::StatusOr<ColumnSplit> ParseColumnSplit(absl::string_view name);
// "contiguous" / "strided" / "unspecified".
const char* ColumnSplitName(ColumnSplit split);

// The columns rank `rank` of `tp_size` owns, ascending. InvalidArgument
// unless tp_size >= 1, 0 <= rank < tp_size, num_columns and n_heads >= 1,
// num_columns is a multiple of n_heads, split is kContiguous or kStrided, and
// tp_size divides num_columns (contiguous) or n_heads (strided).
absl::StatusOr<std::vector<int>> RankColumns(ColumnSplit split, int num_columns,
                                             int n_heads, int tp_size,
                                             int rank);

// Rows [begin, end) of one Engram table.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool operator==(const RowRange&) const = default;
};

// What one tensor-parallel rank reads.
struct RankAssignment {
  int rank = 0;
  int tp_size = 1;
  ColumnSplit split = ColumnSplit::kUnspecified;
  // The rank's columns, ascending.
  std::vector<int> columns;
  // One entry per HashLayout layer (same order): the rows of each of
  // `columns`, [offset[c], offset[c] + prime[c]), in the order of `columns`.
  struct LayerRows {
    int layer_id = 0;
    std::vector<RowRange> column_rows;
    // Sum of the ranges' sizes.
    int64_t num_rows = 0;
  };
  std::vector<LayerRows> layers;
};

// The columns and per-layer row ranges of rank `rank`; errors as
// RankColumns().
absl::StatusOr<RankAssignment> AssignRank(const HashLayout& layout,
                                          ColumnSplit split, int tp_size,
                                          int rank);

// `ranges` sorted, with touching or overlapping ranges merged (a contiguous
// rank's columns become one range per layer).
std::vector<RowRange> CoalesceRowRanges(std::span<const RowRange> ranges);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_COLUMN_SPLIT_H_
