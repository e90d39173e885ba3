#include "engram_store/hashing/multipliers.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engram_store/hashing/numpy_random.h"

namespace mneme::engram {

absl::StatusOr<int64_t> MultiplierBound(int64_t compressed_vocab_size) {
  if (compressed_vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engram_compressed_vocab_size must be > 0, got ",
                     compressed_vocab_size));
  }
  const int64_t max_multiplier =
      std::numeric_limits<int64_t>::max() / compressed_vocab_size;
  return std::max<int64_t>(1, max_multiplier / 2);
}

absl::StatusOr<std::vector<int64_t>> LayerMultipliers(
    int layer_id, int64_t compressed_vocab_size, int max_ngram_size) {
  if (layer_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Engram layer id must be >= 0, got ", layer_id));
  }
  if (max_ngram_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_max_ngram_size must be >= 1, got ", max_ngram_size));
  }
  ASSIGN_OR_RETURN(const int64_t bound, MultiplierBound(compressed_vocab_size));
  NumpyGenerator rng = NumpyGenerator::DefaultRng(
      static_cast<uint64_t>(kMultiplierSeedStride * layer_id));
  ASSIGN_OR_RETURN(std::vector<int64_t> draws,
                   rng.Integers(0, bound, static_cast<size_t>(max_ngram_size)));
  std::vector<int64_t> multipliers = std::move(draws);
  // draw < bound <= INT64_MAX / 2, so 2 * draw + 1 cannot overflow.
  for (int64_t& m : multipliers) m = m * 2 + 1;
  return multipliers;
}

}  // namespace mneme::engram
