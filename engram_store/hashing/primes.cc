#include "engram_store/hashing/primes.h"

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace mneme::engram {
namespace {

uint64_t MulMod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t PowMod(uint64_t base, uint64_t exponent, uint64_t m) {
  uint64_t result = 1 % m;
  base %= m;
  while (exponent > 0) {
    if ((exponent & 1) != 0) result = MulMod(result, base, m);
    base = MulMod(base, base, m);
    exponent >>= 1;
  }
  return result;
}

// The smallest prime > start that is not in `taken`.
int64_t NextFreePrime(int64_t start,
                      const absl::flat_hash_set<int64_t>& taken) {
  for (int64_t candidate = start + 1;; ++candidate) {
    if (IsPrime(static_cast<uint64_t>(candidate)) &&
        !taken.contains(candidate)) {
      return candidate;
    }
  }
}

}  // namespace

bool IsPrime(uint64_t n) {
  constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return false;
  for (uint64_t p : kBases) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  for (uint64_t a : kBases) {
    uint64_t x = PowMod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = MulMod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> SearchColumnPrimes(
    int64_t vocab_size, int num_layers, int max_ngram_size, int n_heads) {
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_vocab_size must be in [1, 2^62], got ", vocab_size));
  }
  if (num_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of Engram layers must be >= 0, got ", num_layers));
  }
  if (max_ngram_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_max_ngram_size must be >= 2, got ", max_ngram_size));
  }
  if (n_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("engram_n_heads must be >= 1, got ", n_heads));
  }
  absl::flat_hash_set<int64_t> taken;
  std::vector<std::vector<int64_t>> primes(num_layers);
  for (int layer = 0; layer < num_layers; ++layer) {
    for (int n = 2; n <= max_ngram_size; ++n) {
      int64_t search_start = vocab_size - 1;
      for (int j = 0; j < n_heads; ++j) {
        const int64_t prime = NextFreePrime(search_start, taken);
        taken.insert(prime);
        primes[layer].push_back(prime);
        search_start = prime;
      }
    }
  }
  return primes;
}

}  // namespace mneme::engram
