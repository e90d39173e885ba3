#ifndef MNEME_ENGRAM_STORE_HASHING_PRIMES_H_
#define MNEME_ENGRAM_STORE_HASHING_PRIMES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace mneme::engram {

// Deterministic primality test for every 64-bit value (Miller-Rabin with the
// first twelve primes as bases).
bool IsPrime(uint64_t n);

// The table size (a prime) of every hash column of every Engram layer
// (ENGRAM.md, "Row id computation" 4), as the model's reference searches
// them: for each layer in order, each n-gram order n = 2..max_ngram_size and
// each head j, the smallest prime above the previous head's prime (above
// vocab_size - 1 for head 0 of every order) that no earlier column of any
// layer took. Result[i][c] is layer i's prime for column
// c = (n - 2) * n_heads + j. With one vocab_size for all orders this is
// simply the consecutive primes above vocab_size - 1.
// InvalidArgument unless num_layers >= 0, max_ngram_size >= 2, n_heads >= 1
// and 1 <= vocab_size <= 2^62.
absl::StatusOr<std::vector<std::vector<int64_t>>> SearchColumnPrimes(
    int64_t vocab_size, int num_layers, int max_ngram_size, int n_heads);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_PRIMES_H_
