#include "tests/gpu/backend_conformance/backend_factories.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cuda/host_executor.h"
#include "gpu/cuda/kernel_backend.h"
#include "gtest/gtest.h"

namespace mneme::gpu::conformance {

std::vector<BackendFactory> BackendFactories() {
  std::vector<BackendFactory> factories;
  for (int threads : {1, 3}) {
    factories.push_back(BackendFactory{
        .name = absl::StrCat("cpu_", threads),
        .create = [threads]() -> absl::StatusOr<std::unique_ptr<Backend>> {
          ASSIGN_OR_RETURN(
              std::unique_ptr<CpuBackend> backend,
              CpuBackend::Create(CpuBackendOptions{.threads = threads}));
          return backend;
        }});
  }
  // The CUDA backend's kernels run on the host, item by item.
  factories.push_back(BackendFactory{
      .name = "kernels_host",
      .create = []() -> absl::StatusOr<std::unique_ptr<Backend>> {
        return std::make_unique<KernelBackend>(MakeHostExecutor());
      }});
  AppendCudaBackendFactories(&factories);
  return factories;
}

std::string BackendFactoryName(
    const ::testing::TestParamInfo<BackendFactory>& info) {
  return info.param.name;
}

}  // namespace mneme::gpu::conformance
