#include "common/process_memory.h"

#include <unistd.h>

#include <fstream>

#include "absl/status/status.h"

namespace mneme {

absl::StatusOr<int64_t> ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0;
  int64_t resident = 0;
  if (!(statm >> size >> resident)) {
    return absl::UnavailableError("cannot read /proc/self/statm");
  }
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace mneme
