#ifndef MNEME_GPU_COMM_GRPC_RENDEZVOUS_STORE_H_
#define MNEME_GPU_COMM_GRPC_RENDEZVOUS_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "gpu/comm/rendezvous_store.h"
#include "proto/comm/v1/rendezvous.grpc.pb.h"

namespace mneme::gpu {

struct GrpcRendezvousStoreOptions {
  // The rank-0 worker's gRPC address, "host:port". Required.
  std::string target;
  // Transport security. Default: plaintext.
  ClientTlsOptions tls;
  // Prepended to every key, so that each group (and each generation of a
  // group that re-forms after a failure) has keys of its own and never
  // reads a predecessor's, e.g. "tp/group-3/gen-7/". Required (non-empty).
  std::string key_prefix;
  // Deadline of a Set, and the margin a Get's call deadline gets beyond its
  // wait (so that the server, not the client, ends a wait and names the
  // missing key). Default: 30 s.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Largest response received, in bytes. Default: 64 MiB.
  int max_message_bytes = 64 << 20;
};

// RendezvousStore over the Rendezvous gRPC service of the group's rank-0
// worker (see RendezvousService). Every call carries a deadline and waits
// for the channel to connect within it (wait_for_ready), so ranks may start
// before rank 0's server is up; an unreachable server therefore shows up as
// DeadlineExceeded once the deadline passes, a server that answers
// UNAVAILABLE (e.g. draining) as Unavailable. No retries: Set and Get are
// idempotent, and their callers (communicator creation) retry as a whole.
// Thread-safe; calls may run concurrently on the shared channel.
class GrpcRendezvousStore final : public RendezvousStore {
 public:
  // InvalidArgument naming the field for bad options; errors of the TLS
  // files (NotFound, PermissionDenied). Does not connect yet.
  static absl::StatusOr<std::unique_ptr<GrpcRendezvousStore>> Create(
      const GrpcRendezvousStoreOptions& options);

  // RendezvousStore; keys are relative to options.key_prefix.
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  explicit GrpcRendezvousStore(const GrpcRendezvousStoreOptions& options)
      : options_(options) {}

  const GrpcRendezvousStoreOptions options_;
  std::unique_ptr<comm::v1::Rendezvous::Stub> stub_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_GRPC_RENDEZVOUS_STORE_H_
