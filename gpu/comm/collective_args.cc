#include "gpu/comm/collective_args.h"

#include <cstdint>
#include <initializer_list>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace mneme::gpu {

absl::Status CheckGroupArgs(int rank, int size, absl::Duration timeout) {
  if (size < 1) {
    return absl::InvalidArgumentError("size must be >= 1");
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank must be in [0, size); got ", rank, " of ", size));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be positive");
  }
  return absl::OkStatus();
}

absl::Status CheckCollectiveArgs(int64_t count, int64_t multiple,
                                 std::initializer_list<const float*> buffers) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("count must be >= 0; got ", count));
  }
  if (count > std::numeric_limits<int64_t>::max() /
                  (multiple * static_cast<int64_t>(sizeof(float)))) {
    return absl::InvalidArgumentError(
        absl::StrCat("count ", count, " is too large"));
  }
  if (count > 0) {
    for (const float* b : buffers) {
      if (b == nullptr) {
        return absl::InvalidArgumentError("null buffer with count > 0");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(int root, int size) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root must be in [0, size); got ", root, " of ", size));
  }
  return absl::OkStatus();
}

}  // namespace mneme::gpu
