#include "engram_store/hashing/column_split.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace mneme::engram {

absl::StatusOr<ColumnSplit> ParseColumnSplit(absl::string_view name) {
  if (name == "contiguous") return ColumnSplit::kContiguous;
  if (name == "strided") return ColumnSplit::kStrided;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown column split \"", name, "\" (expected contiguous or strided)"));
}

const char* ColumnSplitName(ColumnSplit split) {
  switch (split) {
    case ColumnSplit::kContiguous:
      return "contiguous";
    case ColumnSplit::kStrided:
      return "strided";
    case ColumnSplit::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::StatusOr<std::vector<int>> RankColumns(ColumnSplit split, int num_columns,
                                             int n_heads, int tp_size,
                                             int rank) {
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size must be >= 1, got ", tp_size));
  }
  if (rank < 0 || rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside [0, ", tp_size, ")"));
  }
  if (n_heads < 1 || num_columns < 1 || num_columns % n_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid column layout: ", num_columns, " columns of ",
                     n_heads, " heads per order"));
  }
  std::vector<int> columns;
  switch (split) {
    case ColumnSplit::kContiguous: {
      if (num_columns % tp_size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "contiguous split: tensor-parallel size ", tp_size,
            " does not divide the ", num_columns, " hash columns"));
      }
      const int per_rank = num_columns / tp_size;
      for (int c = rank * per_rank; c < (rank + 1) * per_rank; ++c) {
        columns.push_back(c);
      }
      return columns;
    }
    case ColumnSplit::kStrided: {
      if (n_heads % tp_size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "strided split: tensor-parallel size ", tp_size,
            " does not divide the ", n_heads,
            " heads per n-gram order (each rank must get the same number "
            "of columns of every order)"));
      }
      for (int c = rank; c < num_columns; c += tp_size) columns.push_back(c);
      return columns;
    }
    case ColumnSplit::kUnspecified:
      break;
  }
  return absl::InvalidArgumentError("column split is unspecified");
}

absl::StatusOr<RankAssignment> AssignRank(const HashLayout& layout,
                                          ColumnSplit split, int tp_size,
                                          int rank) {
  ASSIGN_OR_RETURN(std::vector<int> columns,
                   RankColumns(split, layout.num_columns(), layout.n_heads(),
                               tp_size, rank));
  RankAssignment assignment;
  assignment.rank = rank;
  assignment.tp_size = tp_size;
  assignment.split = split;
  assignment.columns = std::move(columns);
  for (const LayerHashLayout& layer : layout.layers()) {
    RankAssignment::LayerRows rows;
    rows.layer_id = layer.layer_id;
    for (int c : assignment.columns) {
      rows.column_rows.push_back(
          RowRange{layer.offsets[c], layer.offsets[c] + layer.primes[c]});
      rows.num_rows += layer.primes[c];
    }
    assignment.layers.push_back(std::move(rows));
  }
  return assignment;
}

std::vector<RowRange> CoalesceRowRanges(std::span<const RowRange> ranges) {
  std::vector<RowRange> sorted(ranges.begin(), ranges.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const RowRange& a, const RowRange& b) {
              return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
            });
  std::vector<RowRange> merged;
  for (const RowRange& range : sorted) {
    if (!merged.empty() && range.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, range.end);
    } else {
      merged.push_back(range);
    }
  }
  return merged;
}

}  // namespace mneme::engram
