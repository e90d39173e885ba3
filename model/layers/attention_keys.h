#ifndef MNEME_MODEL_LAYERS_ATTENTION_KEYS_H_
#define MNEME_MODEL_LAYERS_ATTENTION_KEYS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "model/dcp_merge.h"

namespace mneme::model {

// Which keys an attention query attends, as index math only: the window
// positions of its sliding window and the compressed entries its indexer
// selected (or all of them), those this rank keeps under DCP. The attention
// of a prefill chunk gathers them once for all its queries (ListChunkKeys);
// a decode step's queries read them where they are in the cache.

// Calls on_window(q) for every window position q of a query at position p
// that this rank keeps (max(0, p - window + 1) .. p, oldest first), then
// on_entry(e) for every entry e of `selected` it keeps, in their order.
template <typename OnWindow, typename OnEntry>
void ForEachKeyOfQuery(const DcpLayout& dcp, int window, int64_t p,
                       absl::Span<const int32_t> selected, OnWindow&& on_window,
                       OnEntry&& on_entry) {
  const bool split = dcp.enabled();
  for (int64_t q = std::max<int64_t>(0, p - window + 1); q <= p; ++q) {
    if (!split || dcp.OwnsEntry(q)) on_window(q);
  }
  for (const int32_t e : selected) {
    if (!split || dcp.OwnsEntry(e)) on_entry(e);
  }
}

// The keys of a chunk's queries (positions p0 .. p0 + n - 1), each key
// listed once for all of them. Key numbers run over `earlier`, then `own`,
// then `entries`.
struct ChunkKeys {
  // Window positions before the chunk that its queries attend and this
  // rank keeps, ascending.
  std::vector<int64_t> earlier;
  // The chunk's own tokens this rank keeps, as offsets in [0, n), ascending.
  std::vector<int32_t> own;
  // The selected entries this rank keeps, each once, in order of first use.
  std::vector<int32_t> entries;
  // Per query j (row-major, `width` each): its key numbers in the order of
  // ForEachKeyOfQuery, then -1.
  std::vector<int32_t> idx;
  int width = 0;

  int64_t keys() const {
    return static_cast<int64_t>(earlier.size() + own.size() + entries.size());
  }
};

// The keys of the queries at positions p0 .. p0 + n - 1 (n >= 1, p0 >= 0)
// with a sliding window of `window` (>= 1) positions; query j attends the
// entries selected[j] (none past the end of `selected`). `width` is window
// plus the most entries any query selects.
ChunkKeys ListChunkKeys(const DcpLayout& dcp, int window, int64_t p0, int64_t n,
                        absl::Span<const std::vector<int32_t>> selected);

// How ChooseTogether groups the rows of indexer choices it makes together:
// rows sorted by `totals` (entries per row, ascending, each >= 1), one
// score matrix per group as wide as its last row. A group takes the next
// row unless its matrix would then hold more than `max_floats` scores or
// more than twice the scores its rows need (one long context among short
// ones is chosen alone rather than padded into every row); a row alone is
// always a group. Returns the end of every group, ascending, the last
// totals.size().
std::vector<size_t> ChoiceGroupEnds(absl::Span<const int64_t> totals,
                                    int64_t max_floats);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_ATTENTION_KEYS_H_
