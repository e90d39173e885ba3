#ifndef MNEME_TESTS_GPU_BACKEND_CONFORMANCE_BACKEND_FACTORIES_H_
#define MNEME_TESTS_GPU_BACKEND_CONFORMANCE_BACKEND_FACTORIES_H_

// The backends the conformance suite runs on: the registration point of
// every Backend implementation (gpu/backend.h) compiled into the test.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"

namespace mneme::gpu::conformance {

// Makes one backend for one test.
struct BackendFactory {
  // The test-name suffix: letters, digits and underscores, e.g. "cpu_1".
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> create;
};

// Every backend of this build: the CPU backend with one thread (everything
// inline) and with three (the pool splits loops), the CUDA backend's
// kernels on the host executor ("kernels_host"), then, under --config=cuda,
// the CUDA backend of each device present (AppendCudaBackendFactories).
std::vector<BackendFactory> BackendFactories();

// The gtest parameter name of a factory (its name).
std::string BackendFactoryName(
    const ::testing::TestParamInfo<BackendFactory>& info);

// Appends the CUDA backends of this build to `factories`: defined by
// cuda_backend_factories.cc under --config=cuda (one per device present, or
// one whose create() is Unavailable with the reason: its cases skip), by
// no_cuda_backend_factories.cc (nothing) otherwise.
void AppendCudaBackendFactories(std::vector<BackendFactory>* factories);

}  // namespace mneme::gpu::conformance

#endif  // MNEME_TESTS_GPU_BACKEND_CONFORMANCE_BACKEND_FACTORIES_H_
