#ifndef MNEME_GPU_CUDA_EXECUTOR_H_
#define MNEME_GPU_CUDA_EXECUTOR_H_

// Where the kernel backend's memory lives and its ops run: a CUDA device
// (cuda_executor.h, under --config=cuda) or the host (host_executor.h), which
// runs the very same ops (kernel_ops.h) in loops so that the backend is
// tested without a GPU.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/cuda/kernel_ops.h"

namespace mneme::gpu {

class Executor {
 public:
  virtual ~Executor() = default;

  // "cuda:0", "host".
  virtual std::string name() const = 0;

  // `bytes` >= 0 of zero-filled memory; ResourceExhausted when out of
  // memory. Never null on success (a zero-byte request gets a small block).
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  // Frees what Allocate returned, after the queued work that uses it.
  virtual void Free(void* p) = 0;

  // Queued copies, in order with the ops. The source of ToDevice may be
  // reused as soon as the call returns.
  virtual void ToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void DeviceCopy(void* dst, const void* src, int64_t bytes) = 0;
  // Waits for the queued work, then copies.
  virtual void ToHost(void* dst, const void* src, int64_t bytes) = 0;
  // A copy beside the queued work (Backend::StageFromHost): ordered after
  // the work queued so far, and before the work queued after AwaitStaged().
  // The source may be reused as soon as the call returns.
  virtual void StageToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual void AwaitStaged() = 0;
  // Waits for the queued work (not for staged copies no AwaitStaged has
  // ordered it after); the first error of a launch or copy so far (kept: a
  // device that failed once stays failed).
  virtual absl::Status Synchronize() = 0;
  // The first error of a launch or copy seen so far, without waiting.
  virtual absl::Status status() const = 0;

  // Queues op(i) for every i < items (items >= 0).
#define MNEME_EXECUTOR_RUN(Op) \
  virtual void Run(const kernels::Op& op, int64_t items) = 0;
  MNEME_KERNEL_OPS(MNEME_EXECUTOR_RUN)
#undef MNEME_EXECUTOR_RUN
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_EXECUTOR_H_
