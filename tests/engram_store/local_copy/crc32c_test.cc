#include "engram_store/local_copy/crc32c.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()),
                             s.size());
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c({}), 0u);
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(Bytes("a")), 0xC1D04330u);
  // RFC 3720 (iSCSI), B.4.
  std::vector<uint8_t> data(32, 0x00);
  EXPECT_EQ(Crc32c(data), 0x8A9136AAu);
  std::fill(data.begin(), data.end(), 0xFF);
  EXPECT_EQ(Crc32c(data), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) data[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(data), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) data[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(data), 0x113FDB5Cu);
}

TEST(Crc32cTest, PortableMatchesAcceleratedAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> data(4096 + 16);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  for (size_t start = 0; start < 16; ++start) {
    for (size_t length :
         {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 264, 144, 1000, 4096}) {
      const auto span = absl::MakeConstSpan(data).subspan(start, length);
      EXPECT_EQ(ExtendCrc32c(0, span), ExtendCrc32cPortable(0, span))
          << start << " " << length;
    }
  }
}

TEST(Crc32cTest, ExtendEqualsTheChecksumOfTheConcatenation) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data(10000);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data);
  for (size_t split : {0, 1, 5, 8, 4999, 9999, 10000}) {
    const auto all = absl::MakeConstSpan(data);
    EXPECT_EQ(ExtendCrc32c(Crc32c(all.subspan(0, split)), all.subspan(split)),
              whole)
        << split;
    EXPECT_EQ(
        ExtendCrc32cPortable(ExtendCrc32cPortable(0, all.subspan(0, split)),
                             all.subspan(split)),
        whole)
        << split;
  }
}

TEST(Crc32cTest, DetectsASingleBitFlip) {
  std::vector<uint8_t> data(size_t{264} * 100, 0x5A);
  const uint32_t before = Crc32c(data);
  for (size_t i : {0ul, 1000ul, data.size() - 1}) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(Crc32c(data), before);
      data[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
  EXPECT_EQ(Crc32c(data), before);
}

TEST(Crc32cTest, ReportsWhetherItIsAccelerated) {
#if defined(__x86_64__)
  EXPECT_EQ(Crc32cIsAccelerated(), __builtin_cpu_supports("sse4.2") != 0);
#else
  (void)Crc32cIsAccelerated();
#endif
}

}  // namespace
}  // namespace mneme::engram
