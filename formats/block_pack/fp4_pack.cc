#include "formats/block_pack/fp4_pack.h"

#include <cassert>

namespace mneme::formats {

void PackE2m1Codes(absl::Span<const uint8_t> codes,
                   absl::Span<uint8_t> packed) {
  assert(codes.size() == 2 * packed.size());
  for (size_t j = 0; j < packed.size(); ++j) {
    packed[j] = PackE2m1Pair(codes[2 * j] & 0xFu, codes[2 * j + 1] & 0xFu);
  }
}

std::optional<uint8_t> E4m3PowerOfTwo(int p) {
  if (p < -9 || p > 8) return std::nullopt;
  // Subnormals 2^-9 .. 2^-7 are mantissa 1, 2, 4 with exponent field 0;
  // normals have exponent field p + 7 and mantissa 0.
  return p < -6 ? static_cast<uint8_t>(1 << (p + 9))
                : static_cast<uint8_t>((p + 7) << 3);
}

}  // namespace mneme::formats
