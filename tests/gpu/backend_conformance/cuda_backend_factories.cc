// AppendCudaBackendFactories under --config=cuda.
//
// gpu/cuda has no Backend implementation yet, so nothing is appended. When
// it has one, append one factory per device that ListDevices()
// (gpu/device_info.h) reports, named "cuda_<index>", so that every
// conformance test also runs on each GPU present (and on none when the
// machine has no GPU: the CPU backends still run).

#include <vector>

#include "tests/gpu/backend_conformance/backend_factories.h"

namespace mneme::gpu::conformance {

void AppendCudaBackendFactories(std::vector<BackendFactory>* /*factories*/) {}

}  // namespace mneme::gpu::conformance
