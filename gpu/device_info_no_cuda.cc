// ListDevices() and RunDeviceSelfTest() for builds without CUDA.
#include "gpu/device_info.h"

namespace mneme::gpu {
namespace {

absl::Status NoCuda() {
  return absl::UnavailableError(
      "this binary was built without CUDA (build with --config=cuda)");
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() { return NoCuda(); }

absl::Status RunDeviceSelfTest(int /*device*/) { return NoCuda(); }

}  // namespace mneme::gpu
