// CreateCudaBackend under --config=cuda: the kernel backend on a CUDA
// stream of one device.

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/cuda/cuda_kernels.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/kernel_backend.h"
#include "gpu/cuda/kernel_ops.h"

namespace mneme::gpu {
namespace {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorString(error));
  return error == cudaErrorMemoryAllocation
             ? absl::ResourceExhaustedError(message)
             : absl::InternalError(message);
}

// One device, one non-blocking stream; every copy and kernel is queued on
// it in call order. Every call first makes the device current on the
// calling thread (steps run on the worker's step thread, not the one that
// created the backend). The first failed launch or copy is kept for good:
// Synchronize reports it from then on (the device's context is then
// usually unusable; the process restarts).
class CudaExecutor final : public Executor {
 public:
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(int device) {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("no usable CUDA device: ", cudaGetErrorString(e)));
    }
    if (device >= count) {
      return absl::UnavailableError(absl::StrCat(
          "CUDA device ", device, " is not there (", count, " visible)"));
    }
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaStatus(e, absl::StrCat("cudaSetDevice(", device, ")"));
    }
    cudaStream_t stream = nullptr;
    if (cudaError_t e =
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaStatus(e, "cudaStreamCreateWithFlags");
    }
    return std::unique_ptr<CudaExecutor>(new CudaExecutor(device, stream));
  }

  ~CudaExecutor() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  std::string name() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    Use();
    void* p = nullptr;
    const int64_t rounded = bytes > 0 ? bytes : 256;
    if (cudaError_t e = cudaMalloc(&p, static_cast<size_t>(rounded));
        e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      return CudaStatus(
          e, absl::StrCat("cudaMalloc of ", bytes, " bytes on ", name()));
    }
    Keep(cudaMemsetAsync(p, 0, static_cast<size_t>(rounded), stream_),
         "cudaMemsetAsync");
    return p;
  }
  void Free(void* p) override {
    Use();
    // After the queued work that may still read it.
    Keep(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Keep(cudaFree(p), "cudaFree");
  }

  void ToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    Use();
    Keep(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                         cudaMemcpyHostToDevice, stream_),
         "cudaMemcpyAsync to the device");
  }
  void DeviceCopy(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    Use();
    Keep(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                         cudaMemcpyDeviceToDevice, stream_),
         "cudaMemcpyAsync on the device");
  }
  void ToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    Use();
    Keep(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                         cudaMemcpyDeviceToHost, stream_),
         "cudaMemcpyAsync to the host");
    Keep(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  absl::Status Synchronize() override {
    Use();
    Keep(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return status_;
  }

#define MNEME_CUDA_RUN(Op)                                             \
  void Run(const kernels::Op& op, int64_t items) override {            \
    Use();                                                             \
    Keep(static_cast<cudaError_t>(cuda::LaunchOp(op, items, stream_)), \
         "launch of " #Op);                                            \
  }
  MNEME_KERNEL_OPS(MNEME_CUDA_RUN)
#undef MNEME_CUDA_RUN

 private:
  CudaExecutor(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}

  // This executor's device on the calling thread (cheap when it already
  // is).
  void Use() {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_) {
      Keep(cudaSetDevice(device_), "cudaSetDevice");
    }
  }

  // Keeps the first error for good.
  void Keep(cudaError_t error, absl::string_view what) {
    if (error != cudaSuccess && status_.ok()) {
      status_ = CudaStatus(error, absl::StrCat(name(), ": ", what));
    }
  }

  int device_;
  cudaStream_t stream_;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index must be >= 0, got ", device));
  }
  absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
      CudaExecutor::Create(device);
  if (!executor.ok()) return executor.status();
  return std::make_unique<KernelBackend>(*std::move(executor));
}

}  // namespace mneme::gpu
