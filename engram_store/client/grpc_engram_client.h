#ifndef MNEME_ENGRAM_STORE_CLIENT_GRPC_ENGRAM_CLIENT_H_
#define MNEME_ENGRAM_STORE_CLIENT_GRPC_ENGRAM_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "engram_store/client/engram_client.h"
#include "proto/engram/v1/engram_store.grpc.pb.h"

namespace mneme::engram {

struct GrpcEngramClientOptions {
  // The store's address, "host:port". Required.
  std::string target;
  // Transport security. Default: plaintext.
  ClientTlsOptions tls;
  // Deadline of each attempt of a call. Default: 10 s.
  absl::Duration timeout = absl::Seconds(10);
  // Attempts per call; only Unavailable is retried. Default: 4.
  int max_attempts = 4;
  // Backoff before the second attempt, doubling up to max_backoff, each
  // with up to 50% random jitter. Default: 50 ms, 2 s.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // Largest message received. Default: 64 MiB.
  int max_message_bytes = 64 << 20;
};

// EngramClient over a gRPC channel to an engram store daemon. Every call
// carries a deadline (options.timeout per attempt); Unavailable (a store
// restarting or draining) is retried with jittered exponential backoff, up
// to max_attempts. A LookupStream is retried only before its first message
// arrived. Thread-safe; calls may run concurrently on the shared channel.
class GrpcEngramClient final : public EngramClient {
 public:
  // InvalidArgument for bad options; errors of the TLS files (NotFound,
  // PermissionDenied) naming them. Does not connect yet.
  static absl::StatusOr<std::unique_ptr<GrpcEngramClient>> Create(
      const GrpcEngramClientOptions& options);

  absl::StatusOr<v1::LookupResponse> Lookup(
      const v1::LookupRequest& request) override;
  absl::StatusOr<v1::LookupResponse> LookupStream(
      const v1::LookupRequest& request) override;
  absl::StatusOr<v1::PrefetchResponse> Prefetch(
      const v1::PrefetchRequest& request) override;
  absl::StatusOr<v1::DescribeResponse> Describe() override;

 private:
  explicit GrpcEngramClient(const GrpcEngramClientOptions& options)
      : options_(options) {}

  // Runs `attempt` (returning a grpc::Status) with the retry policy.
  template <typename Attempt>
  absl::Status WithRetries(Attempt attempt);

  const GrpcEngramClientOptions options_;
  std::unique_ptr<v1::EngramStore::Stub> stub_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CLIENT_GRPC_ENGRAM_CLIENT_H_
