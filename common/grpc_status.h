#ifndef MNEME_COMMON_GRPC_STATUS_H_
#define MNEME_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace mneme {

// The one place where an absl::Status becomes a grpc::Status (and back, for
// clients). Codes map one to one (both follow google.rpc.Code); the message
// is kept verbatim.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace mneme

#endif  // MNEME_COMMON_GRPC_STATUS_H_
