// The host's share of a prefill chunk's attention: listing the keys its
// queries attend (ListChunkKeys), the index the backend's SparseAttention
// reads, at V4-Flash's sizes: a sliding window of 128, 512 selected entries
// a query (index_topk) out of the entries compressed at ratio 4 before it,
// a chunk at 56K tokens of context, 512 to 8192 tokens, without DCP and on
// one rank of DCP 2 (interleave 1).
//
//   bazel build -c opt //tests/bench/model:attention_keys_bench
//   bazel-bin/tests/bench/model/attention_keys_bench --benchmark_min_time=0.2
//
// Side by side in the same run:
// - BM_ListChunkKeys: the listing as the model does it (key numbers by
//   arithmetic for window positions, a dense table for entries);
// - BM_ListChunkKeysHashed: the same listing with the window positions and
//   the entries numbered through hash maps, as the model did before;
// - BM_CopyKeyNumbers: a copy of the finished index (a fresh vector of the
//   same n x width numbers), the least any listing costs.
// Counters: keys (query-key pairs) per second.

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "model/dcp_merge.h"
#include "model/layers/attention_keys.h"

namespace mneme::model {
namespace {

constexpr int kWindow = 128;
constexpr int kTopK = 512;
constexpr int kRatio = 4;
constexpr int64_t kContext = int64_t{56} << 10;

// Each query's selected entries: kTopK of the entries compressed before
// it, ascending (the indexer's choice returns them so).
std::vector<std::vector<int32_t>> Selections(int64_t p0, int64_t n) {
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> selected(n);
  std::vector<int32_t> all;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t visible = (p0 + j + 1) / kRatio;
    all.resize(visible);
    for (int64_t e = 0; e < visible; ++e) all[e] = static_cast<int32_t>(e);
    const int64_t take = std::min<int64_t>(kTopK, visible);
    for (int64_t i = 0; i < take; ++i) {
      std::uniform_int_distribution<int64_t> pick(i, visible - 1);
      std::swap(all[i], all[pick(rng)]);
    }
    selected[j].assign(all.begin(), all.begin() + take);
    std::sort(selected[j].begin(), selected[j].end());
  }
  return selected;
}

DcpLayout Layout(int64_t dcp_size) {
  return DcpLayout{
      .rank = 0, .size = static_cast<int>(dcp_size), .interleave = 1};
}

// The listing with hash maps from window positions and entries to key
// numbers (the model's way before ListChunkKeys).
ChunkKeys ListHashed(const DcpLayout& dcp, int window, int64_t p0, int64_t n,
                     absl::Span<const std::vector<int32_t>> selected) {
  ChunkKeys k;
  const bool split = dcp.enabled();
  const int64_t first = p0 - std::min<int64_t>(p0, window - 1);
  absl::flat_hash_map<int64_t, int32_t> key_of_pos;
  for (int64_t p = first; p < p0 + n; ++p) {
    if (split && !dcp.OwnsEntry(p)) continue;
    key_of_pos[p] = static_cast<int32_t>(k.earlier.size() + k.own.size());
    if (p < p0) {
      k.earlier.push_back(p);
    } else {
      k.own.push_back(static_cast<int32_t>(p - p0));
    }
  }
  const auto n_window = static_cast<int32_t>(k.earlier.size() + k.own.size());
  absl::flat_hash_map<int32_t, int32_t> key_of_entry;
  size_t most = 0;
  for (const std::vector<int32_t>& s : selected) {
    most = std::max(most, s.size());
    for (const int32_t e : s) {
      if (split && !dcp.OwnsEntry(e)) continue;
      if (key_of_entry.contains(e)) continue;
      key_of_entry[e] = n_window + static_cast<int32_t>(k.entries.size());
      k.entries.push_back(e);
    }
  }
  k.width = window + static_cast<int>(most);
  k.idx.assign(static_cast<size_t>(n) * k.width, -1);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    int32_t* row = k.idx.data() + j * k.width;
    int c = 0;
    for (int64_t q = std::max<int64_t>(0, p - window + 1); q <= p; ++q) {
      auto it = key_of_pos.find(q);
      if (it != key_of_pos.end()) row[c++] = it->second;
    }
    for (const int32_t e : selected[j]) {
      auto it = key_of_entry.find(e);
      if (it != key_of_entry.end()) row[c++] = it->second;
    }
  }
  return k;
}

void SetCounters(benchmark::State& state, int64_t n) {
  state.counters["keys"] =
      benchmark::Counter(static_cast<double>(n * (kWindow + kTopK)),
                         benchmark::Counter::kIsIterationInvariantRate);
}

using Listing = ChunkKeys (*)(const DcpLayout&, int, int64_t, int64_t,
                              absl::Span<const std::vector<int32_t>>);

// Times `list` on the case of `state`, after checking that it lists what
// ListChunkKeys does.
void TimeListing(benchmark::State& state, Listing list) {
  const int64_t n = state.range(0);
  const DcpLayout dcp = Layout(state.range(1));
  const std::vector<std::vector<int32_t>> selected = Selections(kContext, n);
  const ChunkKeys want = ListChunkKeys(dcp, kWindow, kContext, n, selected);
  const ChunkKeys got = list(dcp, kWindow, kContext, n, selected);
  if (got.idx != want.idx || got.entries != want.entries) {
    state.SkipWithError("the listing differs from ListChunkKeys");
    return;
  }
  for (auto _ : state) {
    ChunkKeys k = list(dcp, kWindow, kContext, n, selected);
    benchmark::DoNotOptimize(k.idx.data());
  }
  SetCounters(state, n);
}

void BM_ListChunkKeys(benchmark::State& state) {
  TimeListing(state, &ListChunkKeys);
}

void BM_ListChunkKeysHashed(benchmark::State& state) {
  TimeListing(state, &ListHashed);
}

void BM_CopyKeyNumbers(benchmark::State& state) {
  const int64_t n = state.range(0);
  const DcpLayout dcp = Layout(state.range(1));
  const std::vector<int32_t> idx =
      ListChunkKeys(dcp, kWindow, kContext, n, Selections(kContext, n)).idx;
  for (auto _ : state) {
    std::vector<int32_t> copy(idx);
    benchmark::DoNotOptimize(copy.data());
  }
  SetCounters(state, n);
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "dcp"});
  for (const int64_t dcp : {1, 2}) {
    for (const int64_t n : {512, 2048, 8192}) b->Args({n, dcp});
  }
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_ListChunkKeys)->Apply(Sizes);
BENCHMARK(BM_ListChunkKeysHashed)->Apply(Sizes);
BENCHMARK(BM_CopyKeyNumbers)->Apply(Sizes);

}  // namespace
}  // namespace mneme::model
