// A decode step's sparse attention at V4-Flash's sizes on one rank of TP 4
// (16 heads of 512; per query 640 keys: the 128-token window and 512
// selected entries), for a batch of sequences whose keys lie scattered in a
// paged pool, issued two ways on any Backend:
//  - Gathered: what a step did before model/layers/attention.cc attended in
//    place: per sequence, its window keys, its own new key and its selected
//    entries gathered into a contiguous copy, attention over the copy, then
//    the new key copied out and written into its ring slot (six calls);
//  - InPlace: what a decode step does now: every sequence's new key written
//    into its ring slot (one call), then every sequence's query attending its
//    keys where they are in the pool (one call).
// Both compute the same outputs (the same keys in the same order per
// query); Matches() checks that before a benchmark times them.

#ifndef MNEME_TESTS_BENCH_GPU_DECODE_ATTENTION_CASE_H_
#define MNEME_TESTS_BENCH_GPU_DECODE_ATTENTION_CASE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::bench {

class DecodeAttentionCase {
 public:
  static constexpr int kHeads = 16;
  static constexpr int64_t kHeadDim = 512;
  static constexpr int kWindow = 128;
  static constexpr int kSelected = 512;
  static constexpr int kKeys = kWindow + kSelected;
  // The pool: 64 MiB of f32 rows, more than a CPU's caches hold.
  static constexpr int64_t kPoolRows = 32768;

  // `sequences` in [1, kPoolRows / kKeys]; random queries, keys and sinks
  // from `seed`.
  static absl::StatusOr<std::unique_ptr<DecodeAttentionCase>> Create(
      gpu::Backend& backend, int sequences, uint32_t seed);

  void Gathered();
  void InPlace();
  // Runs both (and synchronizes); OK when their outputs and log-sum-exps
  // are equal within `tolerance` (relative to the largest magnitude).
  absl::Status Matches(float tolerance);

  int sequences() const { return sequences_; }
  // The bytes of key rows one call of either way attends.
  int64_t key_bytes() const {
    return int64_t{sequences_} * kKeys * kHeadDim * 4;
  }

 private:
  DecodeAttentionCase(gpu::Backend& backend, int sequences)
      : backend_(backend), sequences_(sequences) {}

  gpu::Backend& backend_;
  const int sequences_;
  std::unique_ptr<gpu::Buffer> pool_, q_, kv_, sink_, keys_, tail_, out_, lse_;
  // Per sequence: pool rows of its window (oldest first, the last being
  // its new key's ring slot) and of its selected entries.
  std::vector<std::vector<int32_t>> window_rows_, entry_rows_;
  // InPlace's ring slots and per-query pool rows, [sequences, kKeys].
  std::vector<int32_t> ring_rows_, pool_idx_;
  // Gathered's key order in the copy: 0..kKeys-1.
  std::vector<int32_t> copy_idx_;
};

}  // namespace mneme::bench

#endif  // MNEME_TESTS_BENCH_GPU_DECODE_ATTENTION_CASE_H_
