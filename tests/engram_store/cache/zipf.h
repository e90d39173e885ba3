#ifndef MNEME_TESTS_ENGRAM_STORE_CACHE_ZIPF_H_
#define MNEME_TESTS_ENGRAM_STORE_CACHE_ZIPF_H_

#include <cmath>
#include <cstdint>
#include <random>

namespace mneme::engram::testing {

// Zipf-like ranks in [0, n): rank r is drawn with probability roughly
// proportional to 1 / (r + 1)^s (inverse CDF of the continuous bounded power
// law, floored). Deterministic for a seed.
class ZipfGenerator {
 public:
  ZipfGenerator(uint64_t n, double s, uint64_t seed)
      : n_(n), s_(s), rng_(seed) {
    if (std::abs(s_ - 1.0) > 1e-9) {
      a_ = std::pow(static_cast<double>(n_) + 1, 1 - s_) - 1;
    }
  }

  uint64_t Next() {
    const double u = uniform_(rng_);
    double x;
    if (std::abs(s_ - 1.0) <= 1e-9) {
      x = std::pow(static_cast<double>(n_) + 1, u);
    } else {
      x = std::pow(a_ * u + 1, 1 / (1 - s_));
    }
    uint64_t r = static_cast<uint64_t>(x) - 1;
    return r >= n_ ? n_ - 1 : r;
  }

 private:
  uint64_t n_;
  double s_;
  double a_ = 0;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

// A bijection of [0, 2^bits) that scatters ranks over the key space (so hot
// rows are not neighbours).
inline uint64_t ScatterRank(uint64_t rank, int bits) {
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  return (rank * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL) & mask;
}

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_CACHE_ZIPF_H_
