#ifndef MNEME_GPU_COMM_RENDEZVOUS_STORE_H_
#define MNEME_GPU_COMM_RENDEZVOUS_STORE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mneme::gpu {

// The key-value store through which the ranks of a worker group meet before
// their communicator exists: each rank publishes what its peers need (Gloo:
// its TCP addresses; NCCL: rank 0's unique id) and waits for theirs.
//
// Implementations: InMemoryRendezvousStore (ranks as threads of one process,
// TP 1, and the store behind the rank-0 worker's Rendezvous gRPC service)
// and GrpcRendezvousStore (a client of that service, across nodes). Keys are
// opaque; a group must use keys no earlier group used (the gRPC client adds
// a per-group, per-generation prefix). Values are small: stores are bounded.
//
// Thread-safe: any number of threads may call concurrently.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Stores `value` under `key`, replacing an earlier value.
  // InvalidArgument for an empty or too long key or a too large value;
  // ResourceExhausted when the store's byte budget would be exceeded;
  // Unavailable / DeadlineExceeded when a remote store cannot be reached.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // The values of `keys`, in order, once all of them exist; waits up to
  // `timeout` for missing ones (a timeout <= 0 does not wait).
  // DeadlineExceeded naming a missing key when the wait ends first;
  // InvalidArgument for no keys, too many, or a bad key; ResourceExhausted
  // when too many gets are already waiting; Unavailable when a remote store
  // cannot be reached or the store is shutting down.
  virtual absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_RENDEZVOUS_STORE_H_
