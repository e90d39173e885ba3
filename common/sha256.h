#ifndef MNEME_COMMON_SHA256_H_
#define MNEME_COMMON_SHA256_H_

// SHA-256 (FIPS 180-4) of byte strings, for content digests the checkpoint
// formats declare (GridBook's codebook and activation-contract digests).
// Not for secrets: no constant-time guarantees.

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mneme {

// Incremental hashing: Update() any number of times, then Finish() once.
// Thread-compatible.
class Sha256 {
 public:
  Sha256();
  void Update(absl::Span<const uint8_t> data);
  void Update(absl::string_view data);
  // The 32-byte digest; the object must not be used afterwards.
  std::array<uint8_t, 32> Finish();

 private:
  void Block(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_ = {};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// A digest as lower-case hex (64 characters).
std::string DigestHex(const std::array<uint8_t, 32>& digest);

// The lower-case hex digest of `data`.
std::string Sha256Hex(absl::Span<const uint8_t> data);

}  // namespace mneme

#endif  // MNEME_COMMON_SHA256_H_
