#ifndef MNEME_GPU_COMM_COLLECTIVE_ARGS_H_
#define MNEME_GPU_COMM_COLLECTIVE_ARGS_H_

// The argument checks every Communicator implementation (communicator.h)
// runs before touching its transport, so that Gloo and NCCL reject the same
// calls with the same messages.

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mneme::gpu {

// InvalidArgument unless size >= 1, rank is in [0, size) and timeout is
// positive (the options of a communicator's Create).
absl::Status CheckGroupArgs(int rank, int size, absl::Duration timeout);

// InvalidArgument for a negative count, count * multiple floats past int64
// bytes (multiple: how many count-sized pieces the largest buffer of the
// collective holds, e.g. the group size for all-gather's output), or a null
// buffer with count > 0.
absl::Status CheckCollectiveArgs(int64_t count, int64_t multiple,
                                 std::initializer_list<const float*> buffers);

// InvalidArgument unless root is in [0, size).
absl::Status CheckRoot(int root, int size);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_COLLECTIVE_ARGS_H_
