#include "engram_store/client/grpc_engram_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/time.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace mneme::engram {
namespace {

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcEngramClient>> GrpcEngramClient::Create(
    const GrpcEngramClientOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("target is required");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be positive");
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("max_attempts must be >= 1");
  }
  if (options.initial_backoff < absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(
        "need 0 <= initial_backoff <= max_backoff");
  }
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError("max_message_bytes must be >= 1");
  }
  ClientChannelOptions channel_options;
  channel_options.tls = options.tls;
  channel_options.max_receive_message_bytes = options.max_message_bytes;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   CreateClientChannel(options.target, channel_options));
  std::unique_ptr<GrpcEngramClient> client(new GrpcEngramClient(options));
  client->stub_ = v1::EngramStore::NewStub(channel);
  return client;
}

template <typename Attempt>
absl::Status GrpcEngramClient::WithRetries(Attempt attempt) {
  absl::BitGen rng;
  absl::Duration backoff = options_.initial_backoff;
  absl::Status status;
  for (int i = 0; i < options_.max_attempts; ++i) {
    if (i > 0) {
      absl::SleepFor(backoff * absl::Uniform(rng, 0.5, 1.0));
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
    status = FromGrpcStatus(attempt());
    if (status.code() != absl::StatusCode::kUnavailable) return status;
  }
  return status;
}

absl::StatusOr<v1::LookupResponse> GrpcEngramClient::Lookup(
    const v1::LookupRequest& request) {
  v1::LookupResponse response;
  RETURN_IF_ERROR(WithRetries([&] {
    grpc::ClientContext context;
    SetDeadline(context, options_.timeout);
    response.Clear();
    return stub_->Lookup(&context, request, &response);
  }));
  return response;
}

absl::StatusOr<v1::LookupResponse> GrpcEngramClient::LookupStream(
    const v1::LookupRequest& request) {
  v1::LookupResponse merged;
  bool received = false;
  absl::Status s = WithRetries([&]() -> grpc::Status {
    if (received) {
      // Rows already arrived: a retry could duplicate them; give up.
      return grpc::Status(grpc::StatusCode::ABORTED,
                          "the stream broke after rows arrived");
    }
    grpc::ClientContext context;
    SetDeadline(context, options_.timeout);
    merged.Clear();
    std::unique_ptr<grpc::ClientReader<v1::LookupResponse>> reader =
        stub_->LookupStream(&context, request);
    v1::LookupResponse message;
    while (reader->Read(&message)) {
      if (!received) {
        merged.set_row_dim(message.row_dim());
        merged.set_row_bytes(message.row_bytes());
        merged.set_encoding(message.encoding());
      }
      received = true;
      merged.mutable_rows()->append(message.rows());
      merged.mutable_row_ids()->MergeFrom(message.row_ids());
    }
    return reader->Finish();
  });
  RETURN_IF_ERROR(s);
  return merged;
}

absl::StatusOr<v1::PrefetchResponse> GrpcEngramClient::Prefetch(
    const v1::PrefetchRequest& request) {
  v1::PrefetchResponse response;
  RETURN_IF_ERROR(WithRetries([&] {
    grpc::ClientContext context;
    SetDeadline(context, options_.timeout);
    return stub_->Prefetch(&context, request, &response);
  }));
  return response;
}

absl::StatusOr<v1::DescribeResponse> GrpcEngramClient::Describe() {
  v1::DescribeResponse response;
  RETURN_IF_ERROR(WithRetries([&] {
    grpc::ClientContext context;
    SetDeadline(context, options_.timeout);
    response.Clear();
    return stub_->Describe(&context, v1::DescribeRequest(), &response);
  }));
  return response;
}

}  // namespace mneme::engram
