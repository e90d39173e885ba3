#ifndef MNEME_ENGRAM_STORE_HASHING_NUMPY_RANDOM_H_
#define MNEME_ENGRAM_STORE_HASHING_NUMPY_RANDOM_H_

// A bit-exact C++ reproduction of the parts of numpy.random (numpy >= 1.17)
// that the Engram multipliers are drawn with:
//
//   np.random.default_rng(seed).integers(low, high, size=n)   # dtype int64
//
// = SeedSequence(seed) -> PCG64 -> Generator.integers (Lemire's bounded
// method; ranges that fit in 32 bits draw 32-bit values, two per 64-bit
// output). Only what the model's reference uses is reproduced: integer seeds,
// no spawn keys, int64 output, exclusive upper bound.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace mneme::engram {

// numpy.random.SeedSequence with the default pool size (4 words) and no
// spawn key: hashes the seed's entropy words into a pool, from which
// GenerateState*() derives any number of well-mixed state words.
// A value type; thread-compatible.
class SeedSequence {
 public:
  static constexpr int kPoolSize = 4;

  // `entropy_words` are the seed's 32-bit words, least significant first, as
  // numpy coerces a non-negative Python int (0 -> {0}). Any length, including
  // more words than the pool holds.
  explicit SeedSequence(std::span<const uint32_t> entropy_words);

  // SeedSequence(seed) for a non-negative integer seed that fits 64 bits.
  static SeedSequence FromSeed(uint64_t seed);

  // generate_state(n_words, dtype=np.uint32).
  std::vector<uint32_t> GenerateState32(size_t n_words) const;
  // generate_state(n_words, dtype=np.uint64): pairs of 32-bit words, the
  // first of each pair in the low half.
  std::vector<uint64_t> GenerateState64(size_t n_words) const;

  // The mixed entropy pool (SeedSequence.pool).
  const std::array<uint32_t, kPoolSize>& pool() const { return pool_; }

 private:
  std::array<uint32_t, kPoolSize> pool_{};
};

// numpy.random.PCG64: a 128-bit LCG (multiplier
// 0x2360ed051fc65da44385df649fccf645) with the XSL-RR 64-bit output.
// A value type; thread-compatible.
class Pcg64 {
 public:
  // PCG64(seed_sequence): four uint64 state words w; initial state
  // (w[0] << 64 | w[1]), stream (w[2] << 64 | w[3]), seeded as pcg64_srandom.
  explicit Pcg64(const SeedSequence& seed_sequence);
  // pcg64_srandom(initstate, initseq): state 0, increment (initseq << 1) | 1,
  // step, add initstate, step.
  Pcg64(unsigned __int128 initstate, unsigned __int128 initseq);

  // One 64-bit output (BitGenerator.random_raw()).
  uint64_t NextUint64();
  // numpy's next_uint32: the low half of a fresh 64-bit output, and the next
  // call returns its high half.
  uint32_t NextUint32();

  // The LCG state and increment (bit_generator.state["state"]).
  unsigned __int128 state() const { return state_; }
  unsigned __int128 increment() const { return increment_; }
  // Whether a buffered high half is pending (state["has_uint32"]) and its
  // value (state["uinteger"]).
  bool has_uint32() const { return has_uint32_; }
  uint32_t uinteger() const { return uinteger_; }

 private:
  void Step();

  unsigned __int128 state_ = 0;
  unsigned __int128 increment_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.random.Generator, reduced to Generator.integers with dtype int64.
// A value type; thread-compatible.
class NumpyGenerator {
 public:
  explicit NumpyGenerator(Pcg64 bit_generator)
      : bit_generator_(bit_generator) {}

  // np.random.default_rng(seed) for a non-negative integer seed.
  static NumpyGenerator DefaultRng(uint64_t seed);

  // Generator.integers(low, high, size=size) with dtype=np.int64 and
  // endpoint=False: `size` values uniform in [low, high). Draws exactly the
  // bit generator outputs numpy draws. InvalidArgument when low >= high.
  absl::StatusOr<std::vector<int64_t>> Integers(int64_t low, int64_t high,
                                                size_t size);

  Pcg64& bit_generator() { return bit_generator_; }

 private:
  // numpy's buffered_bounded_lemire_uint32 for a range [0, rng], rng <
  // 0xFFFFFFFF.
  uint32_t BoundedLemire32(uint32_t rng);
  // numpy's bounded_lemire_uint64 for a range [0, rng], rng < 2^64 - 1.
  uint64_t BoundedLemire64(uint64_t rng);

  Pcg64 bit_generator_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_NUMPY_RANDOM_H_
