#include "engram_store/client/in_process_engram_client.h"

#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace mneme::engram {

absl::StatusOr<v1::LookupResponse> InProcessEngramClient::Lookup(
    const v1::LookupRequest& request) {
  v1::LookupResponse response;
  RETURN_IF_ERROR(handler_.Lookup(request, absl::Now() + timeout_, &response));
  return response;
}

absl::StatusOr<v1::LookupResponse> InProcessEngramClient::LookupStream(
    const v1::LookupRequest& request) {
  ASSIGN_OR_RETURN(
      ResolvedRequest resolved,
      handler_.ResolveLookup(request, handler_.limits().max_rows_per_stream));
  v1::LookupResponse response;
  RETURN_IF_ERROR(handler_.LookupRows(resolved, 0, resolved.row_ids.size(),
                                      absl::Now() + timeout_, &response));
  return response;
}

absl::StatusOr<v1::PrefetchResponse> InProcessEngramClient::Prefetch(
    const v1::PrefetchRequest& request) {
  v1::PrefetchResponse response;
  RETURN_IF_ERROR(handler_.Prefetch(request, &response));
  return response;
}

absl::StatusOr<v1::DescribeResponse> InProcessEngramClient::Describe() {
  v1::DescribeResponse response;
  handler_.Describe(&response);
  return response;
}

}  // namespace mneme::engram
