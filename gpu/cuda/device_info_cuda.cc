// ListDevices() and RunDeviceSelfTest() on the CUDA runtime.
#include <cuda_runtime.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu/cuda/self_test_kernel.h"
#include "gpu/device_info.h"

namespace mneme::gpu {
namespace {

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device visible");
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaGetDeviceProperties(", i, ")"));
    }
    devices.push_back(DeviceInfo{i, prop.name,
                                 static_cast<int64_t>(prop.totalGlobalMem),
                                 prop.major, prop.minor});
  }
  return devices;
}

absl::Status RunDeviceSelfTest(int device) {
  ASSIGN_OR_RETURN(const std::vector<DeviceInfo> devices, ListDevices());
  if (device < 0 || device >= static_cast<int>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " out of range [0, ", devices.size(), ")"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice");
  }
  constexpr int64_t kElements = 1 << 20;
  constexpr uint32_t kSeed = 0x5eed;
  uint32_t* buffer = nullptr;
  if (cudaError_t e = cudaMalloc(&buffer, kElements * sizeof(uint32_t));
      e != cudaSuccess) {
    return CudaError(e, "cudaMalloc");
  }
  std::vector<uint32_t> host(kElements);
  absl::Status status = absl::OkStatus();
  if (int e = cuda::LaunchPatternKernel(buffer, kElements, kSeed); e != 0) {
    status = CudaError(static_cast<cudaError_t>(e), "pattern kernel launch");
  } else if (cudaError_t e2 =
                 cudaMemcpy(host.data(), buffer, kElements * sizeof(uint32_t),
                            cudaMemcpyDeviceToHost);
             e2 != cudaSuccess) {
    status = CudaError(e2, "cudaMemcpy");
  } else {
    for (int64_t i = 0; i < kElements; ++i) {
      const uint32_t want = static_cast<uint32_t>(i) * 2654435761u + kSeed;
      if (host[i] != want) {
        status = absl::InternalError(absl::StrCat(
            "device ", device, " wrote ", host[i], " at ", i, ", want ", want));
        break;
      }
    }
  }
  cudaFree(buffer);
  return status;
}

}  // namespace mneme::gpu
