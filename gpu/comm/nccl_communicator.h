#ifndef MNEME_GPU_COMM_NCCL_COMMUNICATOR_H_
#define MNEME_GPU_COMM_NCCL_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/comm/communicator.h"
#include "gpu/comm/rendezvous_store.h"

namespace mneme::gpu {

struct NcclCommunicatorOptions {
  // This process's rank, in [0, size). Default: 0.
  int rank = 0;
  // Ranks in the group, >= 1. Default: 1.
  int size = 1;
  // CUDA device index this rank's buffers live on (one device per rank).
  // Default: 0.
  int device = 0;
  // Bounds the rendezvous (every rank must arrive within it) and each
  // collective, end to end; past it the communicator is aborted.
  // Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
};

// A Communicator over NCCL on device memory (buffers are CUDA device
// pointers on options.device; counts in floats).
//
// Rank 0 creates the group's NCCL unique id and publishes it in `store`
// (key "nccl/unique_id"; the store's prefix keeps groups and generations
// apart); the other ranks wait for it there, so over GrpcRendezvousStore
// the id travels by gRPC. The communicator is non-blocking (NCCL's
// `blocking = 0`): initialisation and each collective are polled until
// done, and aborted (ncclCommAbort) when they fail or pass `timeout`, so a
// dead peer never hangs the caller. Each collective runs on the
// communicator's own stream and is complete when the call returns.
// Barrier is a one-float all-reduce on a scratch buffer (NCCL has none).
//
// Errors: InvalidArgument naming the field for bad options or arguments;
// DeadlineExceeded when the group does not assemble or a collective does
// not finish within `timeout`; Unavailable for NCCL or CUDA failures (with
// ncclGetErrorString / cudaGetErrorString) and in builds without CUDA
// ("built without CUDA"); the store's errors as they are. After an error
// in a collective the communicator is broken as Communicator says.
//
// Thread-safety: one thread at a time, as Communicator says.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options, RendezvousStore& store);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_NCCL_COMMUNICATOR_H_
