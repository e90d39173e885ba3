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
  // Page-locked host memory of `bytes` >= 0, zero-filled
  // (Backend::HostStaging): the source of StageToDevice's copies and, where
  // ReadsPinnedInPlace(), memory the ops read in place. ResourceExhausted
  // when none can be had. Never null on success.
  virtual absl::StatusOr<void*> AllocatePinned(int64_t bytes) = 0;
  // Frees what AllocatePinned returned, after the queued work and staged
  // copies that may use it.
  virtual void FreePinned(void* p) = 0;
  // Whether the device reads pinned host memory in place at the speed of
  // its own (it shares the host's memory: an integrated GPU such as GB10).
  virtual bool ReadsPinnedInPlace() const = 0;
  // The device's address of pinned bytes [src, src + bytes) for the ops
  // queued from now on, which read them in place: the host leaves them
  // unchanged until Synchronize() returns.
  virtual const void* PinnedForDevice(const void* src, int64_t bytes) = 0;
  // A copy from pinned memory beside the queued work
  // (Backend::StageFromHost): ordered after the work queued so far, and
  // before the work queued after AwaitStaged(). The host leaves the source
  // unchanged until Synchronize() returns after AwaitStaged().
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
