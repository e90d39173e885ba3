#include "gpu/comm/grpc_rendezvous_store.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/time.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace mneme::gpu {

absl::StatusOr<std::unique_ptr<GrpcRendezvousStore>>
GrpcRendezvousStore::Create(const GrpcRendezvousStoreOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("target is required");
  }
  if (options.key_prefix.empty()) {
    return absl::InvalidArgumentError(
        "key_prefix is required (one per group and generation)");
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("rpc_timeout must be positive");
  }
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError("max_message_bytes must be >= 1");
  }
  ClientChannelOptions channel_options;
  channel_options.tls = options.tls;
  channel_options.max_receive_message_bytes = options.max_message_bytes;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   CreateClientChannel(options.target, channel_options));
  std::unique_ptr<GrpcRendezvousStore> store(new GrpcRendezvousStore(options));
  store->stub_ = comm::v1::Rendezvous::NewStub(channel);
  return store;
}

absl::Status GrpcRendezvousStore::Set(absl::string_view key,
                                      absl::string_view value) {
  comm::v1::SetRequest request;
  request.set_key(absl::StrCat(options_.key_prefix, key));
  request.set_value(value.data(), value.size());
  comm::v1::SetResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  context.set_wait_for_ready(true);
  return FromGrpcStatus(stub_->Set(&context, request, &response));
}

absl::StatusOr<std::vector<std::string>> GrpcRendezvousStore::Get(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  comm::v1::GetRequest request;
  for (const std::string& key : keys) {
    request.add_keys(absl::StrCat(options_.key_prefix, key));
  }
  timeout = std::max(timeout, absl::ZeroDuration());
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  comm::v1::GetResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + timeout + options_.rpc_timeout));
  context.set_wait_for_ready(true);
  RETURN_IF_ERROR(FromGrpcStatus(stub_->Get(&context, request, &response)));
  if (response.values_size() != request.keys_size()) {
    return absl::InternalError(
        absl::StrCat("the rendezvous server returned ", response.values_size(),
                     " values for ", request.keys_size(), " keys"));
  }
  return std::vector<std::string>(
      std::make_move_iterator(response.mutable_values()->begin()),
      std::make_move_iterator(response.mutable_values()->end()));
}

}  // namespace mneme::gpu
