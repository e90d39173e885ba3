// AppendCudaBackendFactories of builds without --config=cuda: no CUDA
// backend is compiled in.

#include <vector>

#include "tests/gpu/backend_conformance/backend_factories.h"

namespace mneme::gpu::conformance {

void AppendCudaBackendFactories(std::vector<BackendFactory>* /*factories*/) {}

}  // namespace mneme::gpu::conformance
