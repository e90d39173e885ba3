#include "model/layers/attention_keys.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mneme::model {

ChunkKeys ListChunkKeys(const DcpLayout& dcp, int window, int64_t p0, int64_t n,
                        absl::Span<const std::vector<int32_t>> selected) {
  ChunkKeys k;
  const int64_t first = p0 - std::min<int64_t>(p0, window - 1);
  for (int64_t q = first; q < p0 + n; ++q) {
    if (!dcp.OwnsEntry(q)) continue;
    if (q < p0) {
      k.earlier.push_back(q);
    } else {
      k.own.push_back(static_cast<int32_t>(q - p0));
    }
  }
  // The kept window positions from `first` are numbered in order, so the
  // ones of a query's window [from, p] are the numbers [kept(from),
  // kept(p + 1)), where kept(q) counts the kept positions in [first, q).
  const int64_t kept_before_first = dcp.OwnedEntriesBefore(first);
  const auto kept = [&](int64_t q) {
    return static_cast<int32_t>(dcp.OwnedEntriesBefore(q) - kept_before_first);
  };
  const auto n_window = static_cast<int32_t>(k.earlier.size() + k.own.size());
  size_t most_selected = 0;
  const size_t queries_selecting =
      std::min(selected.size(), static_cast<size_t>(n));
  for (size_t j = 0; j < queries_selecting; ++j) {
    most_selected = std::max(most_selected, selected[j].size());
  }
  k.width = window + static_cast<int>(most_selected);
  k.idx.assign(static_cast<size_t>(n) * k.width, -1);
  // Key number of every entry by entry: kUnseen until first selected,
  // kNotKept for those another rank keeps.
  constexpr int32_t kUnseen = -1, kNotKept = -2;
  std::vector<int32_t> entry_keys;
  const auto entry_key = [&](int32_t e) {
    if (static_cast<size_t>(e) >= entry_keys.size()) {
      entry_keys.resize(static_cast<size_t>(e) + 1, kUnseen);
    }
    int32_t& key = entry_keys[e];
    if (key == kUnseen) {
      if (dcp.OwnsEntry(e)) {
        key = n_window + static_cast<int32_t>(k.entries.size());
        k.entries.push_back(e);
      } else {
        key = kNotKept;
      }
    }
    return key;
  };
  for (int64_t j = 0; j < n; ++j) {
    int32_t* row = k.idx.data() + j * k.width;
    const int64_t p = p0 + j;
    const int32_t end = kept(p + 1);
    for (int32_t key = kept(std::max<int64_t>(0, p - window + 1)); key < end;
         ++key) {
      *row++ = key;
    }
    if (j >= static_cast<int64_t>(queries_selecting)) continue;
    // Without a branch: an entry another rank keeps is written, then
    // overwritten by the next kept one (or by the -1 after the last; a row
    // that lists an entry it does not keep has room past its kept keys).
    const int32_t* const row_end = k.idx.data() + (j + 1) * k.width;
    for (const int32_t e : selected[j]) {
      const int32_t key = entry_key(e);
      *row = key;
      row += key >= 0 ? 1 : 0;
    }
    if (row < row_end) *row = -1;
  }
  return k;
}

std::vector<size_t> ChoiceGroupEnds(absl::Span<const int64_t> totals,
                                    int64_t max_floats) {
  std::vector<size_t> ends;
  for (size_t begin = 0; begin < totals.size();) {
    size_t end = begin;
    int64_t width = 0, scored = 0;
    while (end < totals.size()) {
      const int64_t wider = std::max(width, totals[end]);
      const auto rows = static_cast<int64_t>(end - begin + 1);
      const int64_t want = scored + totals[end];
      if (end > begin &&
          (rows * wider > max_floats || rows * wider > 2 * want)) {
        break;
      }
      width = wider;
      scored = want;
      ++end;
    }
    ends.push_back(end);
    begin = end;
  }
  return ends;
}

}  // namespace mneme::model
