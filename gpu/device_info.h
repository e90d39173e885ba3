#ifndef MNEME_GPU_DEVICE_INFO_H_
#define MNEME_GPU_DEVICE_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mneme::gpu {

// One CUDA device as the runtime reports it.
struct DeviceInfo {
  int index = 0;
  std::string name;
  int64_t total_memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

// True when this binary was built with --config=cuda.
bool BuiltWithCuda();

// The visible CUDA devices. Unavailable when the build has no CUDA or the
// driver/runtime cannot be initialised (no GPU, no driver); an empty list is
// never returned as success.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

// Runs a small kernel on `device` that writes a known pattern and checks it
// on the host: the worker's startup check that the device executes code.
// Unavailable as ListDevices(); InvalidArgument for a bad index; Internal
// with the CUDA error or the first wrong element otherwise.
absl::Status RunDeviceSelfTest(int device);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_DEVICE_INFO_H_
