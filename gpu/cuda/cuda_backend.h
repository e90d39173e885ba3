#ifndef MNEME_GPU_CUDA_CUDA_BACKEND_H_
#define MNEME_GPU_CUDA_CUDA_BACKEND_H_

// The CUDA backend: the kernel backend (kernel_backend.h) on one device's
// stream.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::gpu {

// The CUDA backend of device `device` (its index among the visible
// devices). Unavailable in a build without --config=cuda or when the device
// is not there; InvalidArgument for a negative index.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

// The device time of the kernels a CUDA backend launches, for benchmarks (a
// decode step against the sum of its kernels). While enabled, each launch
// is bracketed by two events on the backend's stream, behind a short gate
// kernel that holds the stream until the launch is queued (so the time the
// host takes to queue it is not counted); timed work runs slower. At most
// kMaxLaunches launches are timed between Resets. Used on the backend's
// thread; once the backend is gone, Seconds and ByOp fail.
class KernelTimer {
 public:
  static constexpr int64_t kMaxLaunches = int64_t{1} << 16;
  virtual ~KernelTimer() = default;
  // Times (true) or stops timing the launches that follow.
  virtual void Enable(bool on) = 0;
  // Forgets the launches timed so far.
  virtual void Reset() = 0;
  // The launches timed since the last Reset.
  virtual int64_t Launches() const = 0;
  // Waits for them and returns their device seconds, summed; an error when
  // the device failed.
  virtual absl::StatusOr<double> Seconds() = 0;
  // The same per kind of kernel (its op, e.g. "LinearOp"), the most device
  // time first.
  struct OpTime {
    std::string op;
    int64_t launches = 0;
    double seconds = 0.0;
  };
  virtual absl::StatusOr<std::vector<OpTime>> ByOp() = 0;
};

// CreateCudaBackend, with *timer (not null) set to the backend's kernel
// timer, disabled.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    int device, std::shared_ptr<KernelTimer>* timer);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_CUDA_CUDA_BACKEND_H_
