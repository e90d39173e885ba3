#ifndef MNEME_ENGRAM_STORE_SERVICE_REQUEST_HANDLER_H_
#define MNEME_ENGRAM_STORE_SERVICE_REQUEST_HANDLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engram_store/engram_store.h"
#include "formats/row_format.h"
#include "proto/engram/v1/engram_store.pb.h"

namespace mneme::engram {

struct RequestLimits {
  // Most rows one Lookup or Prefetch request may ask for (row ids, or
  // non-context tokens x columns); more is ResourceExhausted. Default: 65,536
  // (a 2,730-token prefill chunk at 24 columns).
  int64_t max_rows_per_request = 65536;
  // Most rows of one LookupStream request. Default: 1,048,576.
  int64_t max_rows_per_stream = int64_t{1} << 20;
  // Most row bytes in one LookupStream response message (at least one row
  // is always sent). Default: 4 MiB.
  int64_t max_stream_message_bytes = int64_t{4} << 20;
  // Most row bytes in one Lookup response (rows x bytes per row in the
  // asked encoding): kept below the server's message limit so that a
  // response is never cut by gRPC; more is ResourceExhausted naming
  // LookupStream. Default: 60 MiB (the default message limit is 64 MiB).
  int64_t max_response_bytes = int64_t{60} << 20;
};

// A request validated and resolved to row ids: what a Lookup, LookupStream
// or Prefetch works on.
struct ResolvedRequest {
  int layer_id = 0;
  RowEncoding encoding = RowEncoding::kBf16;
  v1::RowEncoding wire_encoding = v1::ROW_ENCODING_BF16;
  // Bytes per row in `encoding`.
  size_t row_bytes = 0;
  // The table's stored row format and (NVFP4) global scale.
  formats::RowFormat row_format = formats::RowFormat::kUnspecified;
  float global_scale = 1.0f;
  std::vector<int64_t> row_ids;
};

// The transport-free core of the Engram store API over an EngramStore:
// validates requests, hashes token windows, looks rows up and describes the
// store. The gRPC service and the in-process client both call it, so both
// answer identically. Holds no state of its own; thread-safe. `store` is
// borrowed and must outlive it.
class RequestHandler {
 public:
  RequestHandler(EngramStore* store, const RequestLimits& limits)
      : store_(store), limits_(limits) {}

  const RequestLimits& limits() const { return limits_; }

  // Validates a Lookup-shaped request and computes its row ids.
  // InvalidArgument: not an Engram layer, neither or both of row_ids and
  // token_ids, a context_token_count outside [0, token_ids size) (an empty
  // or malformed window), columns or context with row ids, a column out of
  // [0, num_columns) or repeated, an unknown encoding.
  // OutOfRange: a column not served by this store, a token outside the
  // vocabulary. ResourceExhausted: more than `max_rows` rows.
  absl::StatusOr<ResolvedRequest> Resolve(
      int32_t layer_id, const google::protobuf::RepeatedField<int64_t>& row_ids,
      const google::protobuf::RepeatedField<int64_t>& token_ids,
      int32_t context_token_count,
      const google::protobuf::RepeatedField<int32_t>& columns,
      v1::RowEncoding encoding, int64_t max_rows) const;
  absl::StatusOr<ResolvedRequest> ResolveLookup(
      const v1::LookupRequest& request, int64_t max_rows) const;

  // Rows [first, first + count) of `resolved` into `response` (rows,
  // row_dim, row_bytes, encoding, row_ids, first_row). Errors of
  // EngramStore::Lookup (OutOfRange for an id not served, DeadlineExceeded,
  // DataLoss).
  absl::Status LookupRows(const ResolvedRequest& resolved, size_t first,
                          size_t count, absl::Time deadline,
                          v1::LookupResponse* response) const;

  // As LookupRows, but the rows go to `out` (exactly count * row_bytes
  // bytes), and nothing else is written: what a transport that owns the
  // response memory (the shared-memory one) calls.
  absl::Status LookupRowsInto(const ResolvedRequest& resolved, size_t first,
                              size_t count, absl::Time deadline,
                              absl::Span<uint8_t> out) const;

  // Resolve (max_rows_per_request) + LookupRows of every row.
  absl::Status Lookup(const v1::LookupRequest& request, absl::Time deadline,
                      v1::LookupResponse* response) const;

  // Rows per LookupStream message for `resolved` (>= 1).
  size_t RowsPerStreamMessage(const ResolvedRequest& resolved) const;

  // Errors of Resolve (max_rows_per_request); never blocks.
  absl::Status Prefetch(const v1::PrefetchRequest& request,
                        v1::PrefetchResponse* response) const;

  void Describe(v1::DescribeResponse* response) const;

 private:
  EngramStore* const store_;
  const RequestLimits limits_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_SERVICE_REQUEST_HANDLER_H_
