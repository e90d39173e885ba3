#ifndef MNEME_GPU_COMM_COMMUNICATOR_H_
#define MNEME_GPU_COMM_COMMUNICATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mneme::gpu {

// Time and volume spent in collectives since creation (for the share of step
// time the benchmark reports).
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // Payload bytes this rank contributed.
  absl::Duration time;
};

// Collectives over a fixed group of `size()` ranks (the tensor-parallel
// group of the workers). Buffers are backend memory of the backend the
// communicator was made for (host memory for Gloo, device memory for NCCL),
// counts are in floats. Every rank must issue the same collectives in the
// same order with the same counts; a mismatch is a programming error.
//
// Errors: Unavailable when a peer is gone or the transport fails,
// DeadlineExceeded when a collective does not complete within the group's
// timeout. After an error the communicator is broken: every later call
// returns the same error (the worker then leaves and rejoins a new group).
//
// Thread-safety: one thread at a time (the worker's step loop).
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[count] = sum over ranks, on every rank. In place.
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  // out[size * count] = concat over ranks of in[count], rank order.
  virtual absl::Status AllGather(const float* in, int64_t count,
                                 float* out) = 0;
  // out[count] = sum over ranks of in[rank * count .. (rank + 1) * count).
  // in has size * count floats.
  virtual absl::Status ReduceScatterSum(const float* in, int64_t count,
                                        float* out) = 0;
  // data[count] = root's data[count], on every rank.
  virtual absl::Status Broadcast(float* data, int64_t count, int root) = 0;
  // Returns once every rank has entered it.
  virtual absl::Status Barrier() = 0;

  virtual CommStats stats() const = 0;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_COMMUNICATOR_H_
