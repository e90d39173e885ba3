// SHA-256 against the FIPS 180-4 / NIST example digests, and incremental
// updates split at every offset equal to one update.

#include "common/sha256.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mneme {
namespace {

std::string Hex(absl::string_view text) {
  return Sha256Hex(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

TEST(Sha256, NistExamples) {
  EXPECT_EQ(Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::vector<uint8_t> data(300);
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<uint8_t>(i * 131 + 7);
  }
  const std::string whole = Sha256Hex(data);
  for (size_t split = 0; split <= data.size(); split += 13) {
    Sha256 hash;
    hash.Update(absl::MakeConstSpan(data).subspan(0, split));
    hash.Update(absl::MakeConstSpan(data).subspan(split));
    EXPECT_EQ(DigestHex(hash.Finish()), whole) << split;
  }
}

}  // namespace
}  // namespace mneme
