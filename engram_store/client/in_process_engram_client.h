#ifndef MNEME_ENGRAM_STORE_CLIENT_IN_PROCESS_ENGRAM_CLIENT_H_
#define MNEME_ENGRAM_STORE_CLIENT_IN_PROCESS_ENGRAM_CLIENT_H_

#include "absl/time/time.h"
#include "engram_store/client/engram_client.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/request_handler.h"

namespace mneme::engram {

// EngramClient over an EngramStore in the same process (single-process runs,
// tests, and the baseline of the RPC-overhead benchmark). Validates and
// answers exactly like the gRPC service (both use RequestHandler).
// `store` is borrowed and must outlive the client. Thread-safe.
class InProcessEngramClient final : public EngramClient {
 public:
  // `timeout` bounds each lookup, as a call deadline would.
  InProcessEngramClient(EngramStore* store, const RequestLimits& limits,
                        absl::Duration timeout = absl::Seconds(30))
      : handler_(store, limits), timeout_(timeout) {}

  absl::StatusOr<v1::LookupResponse> Lookup(
      const v1::LookupRequest& request) override;
  absl::StatusOr<v1::LookupResponse> LookupStream(
      const v1::LookupRequest& request) override;
  absl::StatusOr<v1::PrefetchResponse> Prefetch(
      const v1::PrefetchRequest& request) override;
  absl::StatusOr<v1::DescribeResponse> Describe() override;

 private:
  const RequestHandler handler_;
  const absl::Duration timeout_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CLIENT_IN_PROCESS_ENGRAM_CLIENT_H_
