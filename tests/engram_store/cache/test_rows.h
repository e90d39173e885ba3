#ifndef MNEME_TESTS_ENGRAM_STORE_CACHE_TEST_ROWS_H_
#define MNEME_TESTS_ENGRAM_STORE_CACHE_TEST_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mneme::engram::testing {

// Fills `out[0, row_bytes)` with the bytes the cache tests store for row
// (table, row): a pseudo-random pattern derived from both, so a row served
// for the wrong key or torn by a race is detected.
inline void FillTestRow(uint32_t table, int64_t row, size_t row_bytes,
                        uint8_t* out) {
  uint64_t x = (uint64_t{table} << 48) ^ static_cast<uint64_t>(row) ^
               0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < row_bytes; i += 8) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    for (size_t b = 0; b < 8 && i + b < row_bytes; ++b) {
      out[i + b] = static_cast<uint8_t>(x >> (8 * b));
    }
  }
}

inline std::vector<uint8_t> TestRow(uint32_t table, int64_t id,
                                    size_t row_bytes) {
  std::vector<uint8_t> out(row_bytes);
  FillTestRow(table, id, row_bytes, out.data());
  return out;
}

inline std::vector<uint8_t> TestRows(uint32_t table,
                                     const std::vector<int64_t>& ids,
                                     size_t row_bytes) {
  std::vector<uint8_t> out(ids.size() * row_bytes);
  for (size_t i = 0; i < ids.size(); ++i) {
    FillTestRow(table, ids[i], row_bytes, out.data() + i * row_bytes);
  }
  return out;
}

// Whether `row` holds the test bytes of (table, id).
inline bool IsTestRow(uint32_t table, int64_t id, size_t row_bytes,
                      const uint8_t* row) {
  uint8_t expected[65536];
  FillTestRow(table, id, row_bytes, expected);
  for (size_t i = 0; i < row_bytes; ++i) {
    if (row[i] != expected[i]) return false;
  }
  return true;
}

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_CACHE_TEST_ROWS_H_
