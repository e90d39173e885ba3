#ifndef MNEME_ENGRAM_STORE_LOCAL_COPY_CRC32C_H_
#define MNEME_ENGRAM_STORE_LOCAL_COPY_CRC32C_H_

#include <cstdint>

#include "absl/types/span.h"

namespace mneme::engram {

// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and
// final xor 0xFFFFFFFF), the checksum of iSCSI, ext4 and RocksDB. Chosen for
// the local copies because x86-64 (SSE 4.2) and ARMv8 (CRC extension) compute
// it in hardware, so checksumming a ~47 GB copy costs a fraction of reading
// it. Pure functions; thread-safe.

// The CRC-32C of `data` appended to bytes whose CRC-32C is `crc`:
// ExtendCrc32c(Crc32c(a), b) == Crc32c(a || b), and Crc32c(empty) == 0.
// Uses the CPU's CRC instruction when it has one (checked once at run time
// on x86-64), else ExtendCrc32cPortable().
uint32_t ExtendCrc32c(uint32_t crc, absl::Span<const uint8_t> data);

// The CRC-32C of `data`.
inline uint32_t Crc32c(absl::Span<const uint8_t> data) {
  return ExtendCrc32c(0, data);
}

// ExtendCrc32c() without CPU instructions (table-driven, slicing by 8 bytes);
// always the same result.
uint32_t ExtendCrc32cPortable(uint32_t crc, absl::Span<const uint8_t> data);

// Whether ExtendCrc32c() uses a CPU instruction on this machine.
bool Crc32cIsAccelerated();

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_LOCAL_COPY_CRC32C_H_
