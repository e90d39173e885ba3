#ifndef MNEME_COMMON_PROCESS_MEMORY_H_
#define MNEME_COMMON_PROCESS_MEMORY_H_

// The calling process's memory as the kernel accounts it.

#include <cstdint>

#include "absl/status/statusor.h"

namespace mneme {

// Bytes of this process resident in memory now (/proc/self/statm: resident
// pages x page size; anonymous and file-backed mappings alike). Unavailable
// where /proc is not mounted.
absl::StatusOr<int64_t> ResidentBytes();

}  // namespace mneme

#endif  // MNEME_COMMON_PROCESS_MEMORY_H_
