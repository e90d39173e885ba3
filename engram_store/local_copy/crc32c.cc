#include "engram_store/local_copy/crc32c.h"

#include <array>
#include <cstddef>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

namespace mneme::engram {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected 0x1EDC6F41

// kTables[0] is the byte-at-a-time table; kTables[k][b] is the CRC of byte b
// followed by k zero bytes, which lets eight bytes be folded per step.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) != 0 ? kPolynomial : 0u);
    }
    tables[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t prev = tables[k - 1][b];
      tables[k][b] = (prev >> 8) ^ tables[0][prev & 0xFFu];
    }
  }
  return tables;
}

constexpr std::array<std::array<uint32_t, 256>, 8> kTables = MakeTables();

uint64_t LoadLittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// `state` is the running (non-inverted) register.
uint32_t UpdatePortable(uint32_t state, const uint8_t* p, size_t n) {
  while (n >= 8) {
    const uint64_t v = LoadLittleEndian64(p) ^ state;
    state = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^
            kTables[5][(v >> 16) & 0xFF] ^ kTables[4][(v >> 24) & 0xFF] ^
            kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
            kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) state = (state >> 8) ^ kTables[0][(state ^ *p++) & 0xFFu];
  return state;
}

#if defined(__x86_64__)

__attribute__((target("sse4.2"))) uint32_t UpdateHardware(uint32_t state,
                                                          const uint8_t* p,
                                                          size_t n) {
  uint64_t s = state;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    s = _mm_crc32_u64(s, v);
    p += 8;
    n -= 8;
  }
  uint32_t s32 = static_cast<uint32_t>(s);
  while (n-- > 0) s32 = _mm_crc32_u8(s32, *p++);
  return s32;
}

bool DetectHardware() { return __builtin_cpu_supports("sse4.2"); }

#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)

uint32_t UpdateHardware(uint32_t state, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    state = __crc32cd(state, v);
    p += 8;
    n -= 8;
  }
  while (n-- > 0) state = __crc32cb(state, *p++);
  return state;
}

bool DetectHardware() { return true; }

#else

uint32_t UpdateHardware(uint32_t state, const uint8_t* p, size_t n) {
  return UpdatePortable(state, p, n);
}

bool DetectHardware() { return false; }

#endif

}  // namespace

uint32_t ExtendCrc32cPortable(uint32_t crc, absl::Span<const uint8_t> data) {
  return ~UpdatePortable(~crc, data.data(), data.size());
}

uint32_t ExtendCrc32c(uint32_t crc, absl::Span<const uint8_t> data) {
  static const bool kHardware = DetectHardware();
  if (kHardware) return ~UpdateHardware(~crc, data.data(), data.size());
  return ~UpdatePortable(~crc, data.data(), data.size());
}

bool Crc32cIsAccelerated() {
  static const bool kHardware = DetectHardware();
  return kHardware;
}

}  // namespace mneme::engram
