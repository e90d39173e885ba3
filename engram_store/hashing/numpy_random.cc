#include "engram_store/hashing/numpy_random.h"

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace mneme::engram {
namespace {

// numpy/random/bit_generator.pyx constants.
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;

uint32_t HashMix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t Mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(0x2360ed051fc65da4ULL) << 64) |
    0x4385df649fccf645ULL;

unsigned __int128 Make128(uint64_t high, uint64_t low) {
  return (static_cast<unsigned __int128>(high) << 64) | low;
}

}  // namespace

SeedSequence::SeedSequence(std::span<const uint32_t> entropy_words) {
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    const uint32_t word =
        static_cast<size_t>(i) < entropy_words.size() ? entropy_words[i] : 0;
    pool_[i] = HashMix(word, hash_const);
  }
  // Mix every pool word into every other so late words affect earlier ones.
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) {
        pool_[dst] = Mix(pool_[dst], HashMix(pool_[src], hash_const));
      }
    }
  }
  // Entropy beyond the pool size is mixed into every pool word.
  for (size_t src = kPoolSize; src < entropy_words.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      pool_[dst] = Mix(pool_[dst], HashMix(entropy_words[src], hash_const));
    }
  }
}

SeedSequence SeedSequence::FromSeed(uint64_t seed) {
  std::vector<uint32_t> words;
  if (seed == 0) words.push_back(0);
  while (seed > 0) {
    words.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  }
  return SeedSequence(words);
}

std::vector<uint32_t> SeedSequence::GenerateState32(size_t n_words) const {
  std::vector<uint32_t> state(n_words);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t value = pool_[i % kPoolSize];
    value ^= hash_const;
    hash_const *= kMultB;
    value *= hash_const;
    value ^= value >> kXShift;
    state[i] = value;
  }
  return state;
}

std::vector<uint64_t> SeedSequence::GenerateState64(size_t n_words) const {
  const std::vector<uint32_t> words = GenerateState32(2 * n_words);
  std::vector<uint64_t> state(n_words);
  for (size_t i = 0; i < n_words; ++i) {
    state[i] = static_cast<uint64_t>(words[2 * i]) |
               (static_cast<uint64_t>(words[2 * i + 1]) << 32);
  }
  return state;
}

Pcg64::Pcg64(const SeedSequence& seed_sequence) {
  const std::vector<uint64_t> words = seed_sequence.GenerateState64(4);
  *this = Pcg64(Make128(words[0], words[1]), Make128(words[2], words[3]));
}

Pcg64::Pcg64(unsigned __int128 initstate, unsigned __int128 initseq) {
  state_ = 0;
  increment_ = (initseq << 1) | 1;
  Step();
  state_ += initstate;
  Step();
}

void Pcg64::Step() { state_ = state_ * kPcgMultiplier + increment_; }

uint64_t Pcg64::NextUint64() {
  Step();
  const uint64_t xored =
      static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rotation = static_cast<unsigned>(state_ >> 122);
  return (xored >> rotation) | (xored << ((64 - rotation) & 63));
}

uint32_t Pcg64::NextUint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = NextUint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

NumpyGenerator NumpyGenerator::DefaultRng(uint64_t seed) {
  return NumpyGenerator(Pcg64(SeedSequence::FromSeed(seed)));
}

uint32_t NumpyGenerator::BoundedLemire32(uint32_t rng) {
  const uint32_t rng_excl = rng + 1;
  uint64_t m =
      static_cast<uint64_t>(bit_generator_.NextUint32()) * uint64_t{rng_excl};
  uint32_t leftover = static_cast<uint32_t>(m & 0xffffffffu);
  if (leftover < rng_excl) {
    // 2^32 mod rng_excl: the count of low values that would bias the result.
    const uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(bit_generator_.NextUint32()) *
          uint64_t{rng_excl};
      leftover = static_cast<uint32_t>(m & 0xffffffffu);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

uint64_t NumpyGenerator::BoundedLemire64(uint64_t rng) {
  const uint64_t rng_excl = rng + 1;
  unsigned __int128 m =
      static_cast<unsigned __int128>(bit_generator_.NextUint64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (UINT64_MAX - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<unsigned __int128>(bit_generator_.NextUint64()) *
          rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

absl::StatusOr<std::vector<int64_t>> NumpyGenerator::Integers(int64_t low,
                                                              int64_t high,
                                                              size_t size) {
  if (low >= high) {
    return absl::InvalidArgumentError(
        absl::StrCat("integers: low (", low, ") must be < high (", high, ")"));
  }
  // numpy samples the closed range [low, high - 1]; rng is its width - 1.
  const uint64_t off = static_cast<uint64_t>(low);
  const uint64_t rng = static_cast<uint64_t>(high - 1) - off;
  std::vector<int64_t> out(size);
  for (size_t i = 0; i < size; ++i) {
    uint64_t value;
    if (rng == 0) {
      value = 0;
    } else if (rng <= 0xffffffffu) {
      value = rng == 0xffffffffu ? bit_generator_.NextUint32()
                                 : BoundedLemire32(static_cast<uint32_t>(rng));
    } else {
      // rng < 2^64 - 1 always holds here: high - 1 - low <= 2^64 - 2.
      value = BoundedLemire64(rng);
    }
    out[i] = static_cast<int64_t>(off + value);
  }
  return out;
}

}  // namespace mneme::engram
