#ifndef MNEME_TESTS_GPU_COMM_COLLECTIVE_CHECKS_H_
#define MNEME_TESTS_GPU_COMM_COLLECTIVE_CHECKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gpu/comm/communicator.h"

namespace mneme::gpu::testing {

// The float rank `rank` contributes at position `i`: small integers, so
// that sums over any group are exact in float32.
float TestValue(int rank, int64_t i);

// Runs every collective of `comm` (a host-memory communicator) once per
// count in `counts` and checks the results element by element against the
// values TestValue() gives each rank; Broadcast once from every root; then
// a Barrier. Every rank of the group must call it with the same counts.
// Returns the communicator's first error, or Internal naming the
// collective, count and first wrong element.
absl::Status RunCollectiveChecks(Communicator& comm,
                                 const std::vector<int64_t>& counts);

}  // namespace mneme::gpu::testing

#endif  // MNEME_TESTS_GPU_COMM_COLLECTIVE_CHECKS_H_
