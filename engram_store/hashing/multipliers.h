#ifndef MNEME_ENGRAM_STORE_HASHING_MULTIPLIERS_H_
#define MNEME_ENGRAM_STORE_HASHING_MULTIPLIERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace mneme::engram {

// Seed of layer L's multiplier generator: kMultiplierSeedStride * L.
inline constexpr int64_t kMultiplierSeedStride = 10007;

// Exclusive upper bound of the random draws behind the multipliers:
// max(1, (INT64_MAX / compressed_vocab_size) / 2), integer divisions. Keeps
// compressed_id * multiplier within int64 for every compressed id.
// InvalidArgument unless compressed_vocab_size > 0.
absl::StatusOr<int64_t> MultiplierBound(int64_t compressed_vocab_size);

// The rolling-hash multipliers of one Engram layer (ENGRAM.md, "Row id
// computation" 2): np.random.default_rng(10007 * layer_id).integers(0, bound,
// size=max_ngram_size), each value * 2 + 1 (odd). Entry k multiplies the
// compressed id k positions back.
// InvalidArgument for a negative layer_id, compressed_vocab_size <= 0 or
// max_ngram_size < 1.
absl::StatusOr<std::vector<int64_t>> LayerMultipliers(
    int layer_id, int64_t compressed_vocab_size, int max_ngram_size);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_MULTIPLIERS_H_
