// CreateNcclCommunicator in builds without --config=cuda.
#include "absl/status/status.h"
#include "gpu/comm/nccl_communicator.h"

namespace mneme::gpu {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options, RendezvousStore& store) {
  (void)options;  // Nothing to validate without NCCL.
  (void)store;
  return absl::UnavailableError(
      "NCCL communicator unavailable: built without CUDA (--config=cuda)");
}

}  // namespace mneme::gpu
