// CreateCudaBackend under --config=cuda: the kernel backend on a CUDA
// stream of one device.

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/cuda/cuda_kernels.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/kernel_backend.h"
#include "gpu/cuda/kernel_ops.h"
#include "gpu/cuda/staging_ring.h"

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

// Pinned host memory the compute stream's host-to-device copies (indices,
// small tensors) are staged through. The copy stream's (the Engram rows)
// come from pinned memory already (AllocatePinned).
constexpr int64_t kComputeStagingBytes = int64_t{8} << 20;
// At most this many staged copies in flight (each holds an event).
constexpr int64_t kMaxStagedInFlight = 1024;

// One device, one non-blocking stream; every copy and kernel is queued on
// it in call order, but for StageToDevice's copies, which go on a second
// stream ordered against the first by events, straight from the caller's
// pinned memory. ToDevice's copies that fit go through a pinned staging
// ring (a copy from pageable memory would first wait for the stream's
// queued work). On a device that shares the host's memory (integrated:
// GB10) the ops read pinned memory in place instead of a staged copy. Every
// call first makes the device current on the calling thread (steps run on the
// worker's step thread, not the one that created the backend). The first
// failed launch or copy is kept for good: Synchronize reports it from then
// on (the device's context is then usually unusable; the process
// restarts).
// KernelTimer by pairs of timing events around each launch on a stream.
// A start event recorded while the device waits for the host would
// complete at once and count the time the host takes to queue the launch as
// the kernel's; so, where mapped pinned memory can be had, each timed
// launch is preceded by a gate kernel that holds the stream until the host
// raises a flag after queueing the launch (at most kGateNs a launch).
class CudaKernelTimer final : public KernelTimer {
 public:
  static constexpr int64_t kGateNs = 20'000'000;

  CudaKernelTimer(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {
    void* flag = nullptr;
    void* device_flag = nullptr;
    if (cudaHostAlloc(&flag, sizeof(uint64_t), cudaHostAllocMapped) ==
            cudaSuccess &&
        cudaHostGetDevicePointer(&device_flag, flag, 0) == cudaSuccess) {
      flag_ = static_cast<volatile uint64_t*>(flag);
      *flag_ = 0;
      device_flag_ = static_cast<const volatile uint64_t*>(device_flag);
    } else {
      cudaGetLastError();
      if (flag != nullptr) cudaFreeHost(flag);
    }
  }
  ~CudaKernelTimer() override {
    cudaSetDevice(device_);
    for (const auto& [start, end] : marks_) {
      cudaEventDestroy(start);
      cudaEventDestroy(end);
    }
    if (flag_ != nullptr) cudaFreeHost(const_cast<uint64_t*>(flag_));
  }
  // The executor's stream is going away: nothing more to time or wait for.
  void Detach() {
    stream_ = nullptr;
    on_ = false;
  }
  CudaKernelTimer(const CudaKernelTimer&) = delete;
  CudaKernelTimer& operator=(const CudaKernelTimer&) = delete;

  void Enable(bool on) override { on_ = on; }
  void Reset() override { used_ = 0; }
  int64_t Launches() const override { return used_; }
  absl::StatusOr<double> Seconds() override {
    ASSIGN_OR_RETURN(std::vector<OpTime> ops, ByOp());
    double seconds = 0.0;
    for (const OpTime& op : ops) seconds += op.seconds;
    return seconds;
  }
  absl::StatusOr<std::vector<OpTime>> ByOp() override {
    if (stream_ == nullptr) {
      return absl::FailedPreconditionError("kernel timer: its backend is gone");
    }
    cudaSetDevice(device_);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return CudaStatus(e, "cudaStreamSynchronize");
    }
    absl::flat_hash_map<const char*, OpTime> by_op;
    for (int64_t i = 0; i < used_; ++i) {
      float ms = 0.0f;
      if (cudaError_t e =
              cudaEventElapsedTime(&ms, marks_[i].first, marks_[i].second);
          e != cudaSuccess) {
        return CudaStatus(e, "cudaEventElapsedTime");
      }
      OpTime& op = by_op[ops_[i]];
      op.op = ops_[i];
      ++op.launches;
      op.seconds += ms / 1e3;
    }
    std::vector<OpTime> out;
    out.reserve(by_op.size());
    for (auto& [name, op] : by_op) out.push_back(std::move(op));
    std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) {
      return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
    });
    return out;
  }

  // Before a launch of `op` (a name that outlives the timer) on the stream:
  // whether it is timed (After must follow).
  bool Before(const char* op) {
    if (!on_ || used_ >= kMaxLaunches) return false;
    if (used_ == static_cast<int64_t>(marks_.size())) {
      cudaEvent_t start = nullptr;
      cudaEvent_t end = nullptr;
      if (cudaEventCreate(&start) != cudaSuccess ||
          cudaEventCreate(&end) != cudaSuccess) {
        cudaGetLastError();
        if (start != nullptr) cudaEventDestroy(start);
        return false;
      }
      marks_.emplace_back(start, end);
      ops_.push_back(nullptr);
    }
    ops_[used_] = op;
    gated_ = device_flag_ != nullptr &&
             cuda::LaunchGate(device_flag_, gates_ + 1, kGateNs, stream_) == 0;
    if (gated_) ++gates_;
    if (cudaEventRecord(marks_[used_].first, stream_) != cudaSuccess) {
      Release();  // untimed: the gate must not hold the launch
      return false;
    }
    return true;
  }
  // After the launch Before timed is queued (even when it failed).
  void After() {
    if (cudaEventRecord(marks_[used_].second, stream_) == cudaSuccess) {
      ++used_;
    }
    Release();
  }

 private:
  // Lets the last gate's kernel go.
  void Release() {
    if (!gated_) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    *flag_ = gates_;
    gated_ = false;
  }

  int device_;
  cudaStream_t stream_;
  bool on_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> marks_;
  std::vector<const char*> ops_;  // the op of each mark
  int64_t used_ = 0;
  // The gate's flag (host and device addresses; null: no gates), the gates
  // queued so far, and whether the launch being timed has one.
  volatile uint64_t* flag_ = nullptr;
  const volatile uint64_t* device_flag_ = nullptr;
  uint64_t gates_ = 0;
  bool gated_ = false;
};

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
    std::unique_ptr<CudaExecutor> executor(new CudaExecutor(device));
    int integrated = 0, maps_host = 0;
    if (cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&maps_host, cudaDevAttrCanMapHostMemory,
                               device) != cudaSuccess) {
      cudaGetLastError();
      integrated = 0;
    }
    executor->in_place_ = integrated != 0 && maps_host != 0;
    for (cudaStream_t* s : {&executor->stream_, &executor->copy_stream_}) {
      if (cudaError_t e = cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
          e != cudaSuccess) {
        return CudaStatus(e, "cudaStreamCreateWithFlags");
      }
    }
    for (cudaEvent_t* ev : {&executor->ordered_, &executor->staged_}) {
      if (cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
          e != cudaSuccess) {
        return CudaStatus(e, "cudaEventCreateWithFlags");
      }
    }
    // Without pinned memory every copy is direct (slower, still correct).
    Pinned& p = executor->compute_pinned_;
    void* memory = nullptr;
    if (cudaHostAlloc(&memory, static_cast<size_t>(p.ring.capacity()),
                      cudaHostAllocDefault) == cudaSuccess) {
      p.memory = static_cast<uint8_t*>(memory);
    } else {
      cudaGetLastError();
    }
    return executor;
  }

  ~CudaExecutor() override {
    if (timer_ != nullptr) timer_->Detach();
    cudaSetDevice(device_);
    for (cudaStream_t s : {stream_, copy_stream_}) {
      if (s != nullptr) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaEvent_t e : {ordered_, staged_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (compute_pinned_.memory != nullptr) cudaFreeHost(compute_pinned_.memory);
  }
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // The timer of this executor's launches (made on the first call).
  std::shared_ptr<CudaKernelTimer> Timer() {
    if (timer_ == nullptr) {
      timer_ = std::make_shared<CudaKernelTimer>(device_, stream_);
    }
    return timer_;
  }

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
    // After the queued work and staged copies that may still use it.
    Keep(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize");
    Keep(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Keep(cudaFree(p), "cudaFree");
  }

  void ToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    Use();
    Upload(dst, src, bytes);
  }
  absl::StatusOr<void*> AllocatePinned(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
    Use();
    void* p = nullptr;
    const int64_t rounded = bytes > 0 ? bytes : 256;
    // Mapped: the device may read it in place (ReadsPinnedInPlace).
    if (cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(rounded),
                                      cudaHostAllocMapped);
        e != cudaSuccess) {
      cudaGetLastError();
      return CudaStatus(e, absl::StrCat("cudaHostAlloc of ", bytes,
                                        " pinned bytes for ", name()));
    }
    std::memset(p, 0, static_cast<size_t>(rounded));
    return p;
  }
  void FreePinned(void* p) override {
    Use();
    Keep(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize");
    Keep(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    Keep(cudaFreeHost(p), "cudaFreeHost");
  }
  bool ReadsPinnedInPlace() const override { return in_place_; }
  const void* PinnedForDevice(const void* src, int64_t bytes) override {
    (void)bytes;
    Use();
    void* device = nullptr;
    Keep(cudaHostGetDevicePointer(&device, const_cast<void*>(src), 0),
         "cudaHostGetDevicePointer");
    return device;
  }
  void StageToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    Use();
    // After the work queued so far (which may still use dst).
    Keep(cudaEventRecord(ordered_, stream_), "cudaEventRecord");
    Keep(cudaStreamWaitEvent(copy_stream_, ordered_, 0), "cudaStreamWaitEvent");
    // The source is pinned and stays unchanged until the copy is done.
    Keep(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                         cudaMemcpyHostToDevice, copy_stream_),
         "cudaMemcpyAsync of staged bytes");
    staged_pending_ = true;
  }
  void AwaitStaged() override {
    if (!staged_pending_) return;
    Use();
    Keep(cudaEventRecord(staged_, copy_stream_), "cudaEventRecord");
    Keep(cudaStreamWaitEvent(stream_, staged_, 0), "cudaStreamWaitEvent");
    staged_pending_ = false;
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
  // The compute stream only: staged copies are read after AwaitStaged,
  // which orders the compute stream after them, so waiting for them here
  // (before every collective) would only undo their overlap.
  absl::Status Synchronize() override {
    Use();
    Keep(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return status_;
  }
  absl::Status status() const override { return status_; }

#define MNEME_CUDA_RUN(Op)                                                    \
  void Run(const kernels::Op& op, int64_t items) override {                   \
    Use();                                                                    \
    const bool timed = items > 0 && timer_ != nullptr && timer_->Before(#Op); \
    Keep(static_cast<cudaError_t>(cuda::LaunchOp(op, items, stream_)),        \
         "launch of " #Op);                                                   \
    if (timed) timer_->After();                                               \
  }
  MNEME_KERNEL_OPS(MNEME_CUDA_RUN)
#undef MNEME_CUDA_RUN

 private:
  // A staging ring and its pinned memory (null: none could be had).
  struct Pinned {
    explicit Pinned(int64_t bytes) : ring(bytes) {}
    uint8_t* memory = nullptr;
    StagingRing ring;
  };

  explicit CudaExecutor(int device)
      : device_(device), compute_pinned_(kComputeStagingBytes) {}

  // A host-to-device copy queued on the compute stream: through its staging
  // ring when it fits (the source copied into pinned memory now, so it is
  // free on return and the device copy is asynchronous), else directly.
  void Upload(void* dst, const void* src, int64_t bytes) {
    Pinned& pinned = compute_pinned_;
    const auto wait = [this](uint64_t fence) {
      Keep(cudaEventSynchronize(events_[fence]), "cudaEventSynchronize");
      free_events_.push_back(fence);
    };
    uint64_t fence = 0;
    if (pinned.memory == nullptr || !pinned.ring.Fits(bytes) ||
        !TakeEvent(fence)) {
      Keep(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                           cudaMemcpyHostToDevice, stream_),
           "cudaMemcpyAsync to the device");
      return;
    }
    if (pinned.ring.in_flight() >= kMaxStagedInFlight) {
      pinned.ring.WaitOldest(wait);
    }
    const int64_t at = pinned.ring.Reserve(bytes, fence, wait);
    std::memcpy(pinned.memory + at, src, static_cast<size_t>(bytes));
    Keep(cudaMemcpyAsync(dst, pinned.memory + at, static_cast<size_t>(bytes),
                         cudaMemcpyHostToDevice, stream_),
         "cudaMemcpyAsync to the device");
    Keep(cudaEventRecord(events_[fence], stream_), "cudaEventRecord");
  }

  // An event for a staged copy: a free one, else a new one. False when none
  // can be made.
  bool TakeEvent(uint64_t& index) {
    if (!free_events_.empty()) {
      index = free_events_.back();
      free_events_.pop_back();
      return true;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    index = events_.size();
    events_.push_back(e);
    return true;
  }

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
  cudaStream_t stream_ = nullptr;
  // StageToDevice's copies.
  cudaStream_t copy_stream_ = nullptr;
  // The compute stream's work so far, before a staged copy; the staged
  // copies, before the work after AwaitStaged.
  cudaEvent_t ordered_ = nullptr;
  cudaEvent_t staged_ = nullptr;
  bool staged_pending_ = false;
  // Whether the ops read pinned memory in place (ReadsPinnedInPlace).
  bool in_place_ = false;
  Pinned compute_pinned_;
  // Per fence (an index), the event that marks its copy done; free ones.
  std::vector<cudaEvent_t> events_;
  std::vector<uint64_t> free_events_;
  absl::Status status_;
  std::shared_ptr<CudaKernelTimer> timer_;
};

// CreateCudaBackend, with *timer set to the executor's timer when timer is
// not null.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, std::shared_ptr<KernelTimer>* timer) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index must be >= 0, got ", device));
  }
  absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
      CudaExecutor::Create(device);
  if (!executor.ok()) return executor.status();
  if (timer != nullptr) *timer = (*executor)->Timer();
  return std::make_unique<KernelBackend>(*std::move(executor));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  return MakeCudaBackend(device, nullptr);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    int device, std::shared_ptr<KernelTimer>* timer) {
  if (timer == nullptr) {
    return absl::InvalidArgumentError("CreateCudaBackend: no timer to set");
  }
  return MakeCudaBackend(device, timer);
}

}  // namespace mneme::gpu
