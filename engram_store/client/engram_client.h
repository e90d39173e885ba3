#ifndef MNEME_ENGRAM_STORE_CLIENT_ENGRAM_CLIENT_H_
#define MNEME_ENGRAM_STORE_CLIENT_ENGRAM_CLIENT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/engram/v1/engram_store.pb.h"

namespace mneme::engram {

// How workers get Engram rows: from the node's engram store daemon over gRPC
// (GrpcEngramClient) or from an EngramStore in the same process
// (InProcessEngramClient). Both answer with the codes of the
// mneme.engram.v1.EngramStore service (engram_store.proto). Implementations
// are thread-safe.
class EngramClient {
 public:
  virtual ~EngramClient() = default;

  // The rows of one batch (up to max_rows_per_request rows).
  virtual absl::StatusOr<v1::LookupResponse> Lookup(
      const v1::LookupRequest& request) = 0;
  // The rows of a large batch (up to max_rows_per_stream rows), fetched in
  // bounded pieces and returned as one response (first_row 0).
  virtual absl::StatusOr<v1::LookupResponse> LookupStream(
      const v1::LookupRequest& request) = 0;
  // As Lookup (stream false) or LookupStream (stream true), but the rows go
  // into `rows`, which must be exactly their size (else DataLoss naming both
  // sizes); returns the values per row. The default runs Lookup /
  // LookupStream and copies the rows; a transport that can write them in
  // place (the shared-memory one) saves that copy.
  virtual absl::StatusOr<int32_t> LookupInto(const v1::LookupRequest& request,
                                             bool stream,
                                             absl::Span<uint8_t> rows);

  virtual absl::StatusOr<v1::PrefetchResponse> Prefetch(
      const v1::PrefetchRequest& request) = 0;
  virtual absl::StatusOr<v1::DescribeResponse> Describe() = 0;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CLIENT_ENGRAM_CLIENT_H_
