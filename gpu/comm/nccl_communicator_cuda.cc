// CreateNcclCommunicator with NCCL; built only under --config=cuda.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/comm/collective_args.h"
#include "gpu/comm/nccl_communicator.h"

namespace mneme::gpu {
namespace {

constexpr char kUniqueIdKey[] = "nccl/unique_id";

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

absl::Status NcclError(ncclResult_t result, ncclComm_t comm,
                       absl::string_view what) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return absl::UnavailableError(
      absl::StrCat(what, ": ", ncclGetErrorString(result),
                   last != nullptr && last[0] != '\0' ? " (" : "",
                   last != nullptr ? last : "",
                   last != nullptr && last[0] != '\0' ? ")" : ""));
}

// Polls `done` (true when finished, or an error) until it is finished or
// `deadline` passes: spins briefly, then sleeps between polls.
template <typename Done>
absl::Status PollUntil(absl::Time deadline, absl::string_view what, Done done) {
  for (int polls = 0;; ++polls) {
    ASSIGN_OR_RETURN(const bool finished, done());
    if (finished) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete within the timeout"));
    }
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(20));
    }
  }
}

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      const NcclCommunicatorOptions& options, RendezvousStore& store);

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }

  absl::Status AllReduceSum(float* data, int64_t count) override {
    if (!broken_.ok()) return broken_;
    RETURN_IF_ERROR(CheckCollectiveArgs(count, 1, {data}));
    return Run("ncclAllReduce", count * sizeof(float), count, [&] {
      return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_,
                           stream_);
    });
  }

  absl::Status AllGather(const float* in, int64_t count, float* out) override {
    if (!broken_.ok()) return broken_;
    RETURN_IF_ERROR(CheckCollectiveArgs(count, options_.size, {in, out}));
    return Run("ncclAllGather", count * sizeof(float), count, [&] {
      return ncclAllGather(in, out, count, ncclFloat, comm_, stream_);
    });
  }

  absl::Status ReduceScatterSum(const float* in, int64_t count,
                                float* out) override {
    if (!broken_.ok()) return broken_;
    RETURN_IF_ERROR(CheckCollectiveArgs(count, options_.size, {in, out}));
    return Run("ncclReduceScatter", count * options_.size * sizeof(float),
               count, [&] {
                 return ncclReduceScatter(in, out, count, ncclFloat, ncclSum,
                                          comm_, stream_);
               });
  }

  absl::Status Broadcast(float* data, int64_t count, int root) override {
    if (!broken_.ok()) return broken_;
    RETURN_IF_ERROR(CheckRoot(root, options_.size));
    RETURN_IF_ERROR(CheckCollectiveArgs(count, 1, {data}));
    const int64_t bytes = options_.rank == root ? count * sizeof(float) : 0;
    return Run("ncclBroadcast", bytes, count, [&] {
      return ncclBroadcast(data, data, count, ncclFloat, root, comm_, stream_);
    });
  }

  absl::Status Barrier() override {
    if (!broken_.ok()) return broken_;
    return Run("barrier", 0, 1, [&] {
      return ncclAllReduce(barrier_, barrier_, 1, ncclFloat, ncclSum, comm_,
                           stream_);
    });
  }

  CommStats stats() const override { return stats_; }

 private:
  explicit NcclCommunicator(const NcclCommunicatorOptions& options)
      : options_(options) {}

  // Aborts the communicator (after a failure or a timeout) so that no
  // operation of it can hang; later calls see broken_.
  void Abort() {
    if (comm_ == nullptr) return;
    // The status is moot: the communicator is being thrown away.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Polls the communicator (and, once the operation is enqueued, the
  // stream) until the last operation finished, failed or timed out.
  absl::Status WaitForCompletion(absl::string_view what, absl::Time deadline,
                                 bool check_stream) {
    return PollUntil(deadline, what, [&]() -> absl::StatusOr<bool> {
      ncclResult_t async = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
          r != ncclSuccess) {
        return NcclError(r, comm_, "ncclCommGetAsyncError");
      }
      if (async == ncclInProgress) return false;
      if (async != ncclSuccess) return NcclError(async, comm_, what);
      if (!check_stream) return true;
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return true;
      if (q == cudaErrorNotReady) return false;
      return CudaError(q, absl::StrCat(what, " on the stream"));
    });
  }

  template <typename Enqueue>
  absl::Status Run(absl::string_view what, int64_t bytes, int64_t count,
                   Enqueue enqueue) {
    const absl::Time start = absl::Now();
    ++stats_.calls;
    stats_.bytes += bytes;
    if (count == 0) return absl::OkStatus();
    broken_ = [&]() -> absl::Status {
      if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
        return CudaError(e, "cudaSetDevice");
      }
      const ncclResult_t r = enqueue();
      if (r != ncclSuccess && r != ncclInProgress) {
        return NcclError(r, comm_, what);
      }
      return WaitForCompletion(what, start + options_.timeout,
                               /*check_stream=*/true);
    }();
    if (!broken_.ok()) Abort();
    stats_.time += absl::Now() - start;
    return broken_;
  }

  const NcclCommunicatorOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // One float of device memory for Barrier().
  float* barrier_ = nullptr;
  absl::Status broken_;
  CommStats stats_;
};

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions& options, RendezvousStore& store) {
  RETURN_IF_ERROR(CheckGroupArgs(options.rank, options.size, options.timeout));
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return CudaError(e, "no usable CUDA device");
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device must be in [0, ", devices, "); got ", options.device));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice");
  }

  ncclUniqueId id;
  static_assert(sizeof(id.internal) == NCCL_UNIQUE_ID_BYTES);
  if (options.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, nullptr, "ncclGetUniqueId");
    }
    RETURN_IF_ERROR(store.Set(
        kUniqueIdKey, absl::string_view(id.internal, sizeof(id.internal))));
  } else {
    ASSIGN_OR_RETURN(const std::vector<std::string> value,
                     store.Get({kUniqueIdKey}, deadline - absl::Now()));
    if (value[0].size() != sizeof(id.internal)) {
      return absl::InternalError(
          absl::StrCat("the rendezvous value of ", kUniqueIdKey, " has ",
                       value[0].size(), " bytes, not ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, value[0].data(), sizeof(id.internal));
  }

  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(options));
  if (cudaError_t e =
          cudaStreamCreateWithFlags(&comm->stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return CudaError(e, "cudaStreamCreateWithFlags");
  }
  if (cudaError_t e = cudaMalloc(&comm->barrier_, sizeof(float));
      e != cudaSuccess) {
    return CudaError(e, "cudaMalloc");
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm->comm_, options.size, id,
                                                options.rank, &config);
  absl::Status s;
  if (r != ncclSuccess && r != ncclInProgress) {
    s = NcclError(r, comm->comm_, "ncclCommInitRankConfig");
  } else {
    s = comm->WaitForCompletion(
        absl::StrCat("NCCL initialisation of rank ", options.rank, " of ",
                     options.size),
        deadline, /*check_stream=*/false);
  }
  if (!s.ok()) {
    comm->Abort();
    return s;
  }
  return std::unique_ptr<Communicator>(std::move(comm));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    // Flush and release cleanly when healthy; abort when that fails or
    // does not finish in time (a peer may be gone).
    absl::Status s;
    if (ncclResult_t r = ncclCommFinalize(comm_);
        r != ncclSuccess && r != ncclInProgress) {
      s = NcclError(r, comm_, "ncclCommFinalize");
    } else {
      s = WaitForCompletion("ncclCommFinalize", absl::Now() + options_.timeout,
                            /*check_stream=*/false);
    }
    if (s.ok()) {
      // Finalized: destroying only frees resources; nothing to report to.
      (void)ncclCommDestroy(comm_);
      comm_ = nullptr;
    } else {
      Abort();
    }
  }
  // Teardown errors have no one to report to.
  if (barrier_ != nullptr) (void)cudaFree(barrier_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options, RendezvousStore& store) {
  return NcclCommunicator::Create(options, store);
}

}  // namespace mneme::gpu
