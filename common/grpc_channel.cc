#include "common/grpc_channel.h"

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <limits>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace mneme {

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& target, const ClientChannelOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("channel target is empty");
  }
  if (options.max_receive_message_bytes < 1 ||
      options.max_receive_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        "max_receive_message_bytes must be in [1, 2^31)");
  }
  if (options.keepalive_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keepalive_time must not be negative");
  }
  if (options.keepalive_time > absl::ZeroDuration() &&
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "keepalive_timeout must be positive when keepalive_time is set");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   MakeChannelCredentials(options.tls));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(
      static_cast<int>(options.max_receive_message_bytes));
  if (!options.tls.server_name_override.empty()) {
    args.SetSslTargetNameOverride(options.tls.server_name_override);
  }
  if (options.keepalive_time > absl::ZeroDuration()) {
    args.SetInt(
        GRPC_ARG_KEEPALIVE_TIME_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
    args.SetInt(
        GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

}  // namespace mneme
