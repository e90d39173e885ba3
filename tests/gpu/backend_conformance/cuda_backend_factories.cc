// AppendCudaBackendFactories under --config=cuda: one CUDA backend per
// device that ListDevices() reports, named "cuda_<index>"; on a machine
// without a GPU one "cuda_none" whose cases skip with the reason.

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/device_info.h"
#include "tests/gpu/backend_conformance/backend_factories.h"

namespace mneme::gpu::conformance {

void AppendCudaBackendFactories(std::vector<BackendFactory>* factories) {
  const absl::StatusOr<std::vector<DeviceInfo>> devices = ListDevices();
  if (!devices.ok()) {
    // Every case is listed and skipped with the reason.
    factories->push_back(BackendFactory{
        .name = "cuda_none",
        .create = [reason = devices.status()]()
            -> absl::StatusOr<std::unique_ptr<Backend>> { return reason; }});
    return;
  }
  for (const DeviceInfo& device : *devices) {
    const int index = device.index;
    factories->push_back(BackendFactory{
        .name = absl::StrCat("cuda_", index),
        .create = [index]() -> absl::StatusOr<std::unique_ptr<Backend>> {
          return CreateCudaBackend(index);
        }});
  }
}

}  // namespace mneme::gpu::conformance
