#include "common/grpc_channel.h"

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mneme {
namespace {

TEST(GrpcChannelTest, PlaintextChannelIsCreatedLazily) {
  // Nothing listens on port 1: creation must still succeed (lazy connect).
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateClientChannel("127.0.0.1:1", ClientChannelOptions{});
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_NE(*channel, nullptr);
  EXPECT_EQ((*channel)->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_IDLE);
}

TEST(GrpcChannelTest, KeepaliveChannel) {
  ClientChannelOptions options;
  options.keepalive_time = absl::Seconds(30);
  options.max_receive_message_bytes = 64 << 20;
  EXPECT_TRUE(CreateClientChannel("127.0.0.1:1", options).ok());
}

TEST(GrpcChannelTest, RejectsInvalidOptionsNamingTheField) {
  EXPECT_EQ(CreateClientChannel("", ClientChannelOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);

  ClientChannelOptions zero_limit;
  zero_limit.max_receive_message_bytes = 0;
  absl::Status status = CreateClientChannel("127.0.0.1:1", zero_limit).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_receive_message_bytes"),
            absl::string_view::npos);

  ClientChannelOptions huge_limit;
  huge_limit.max_receive_message_bytes = int64_t{1} << 40;
  EXPECT_EQ(CreateClientChannel("127.0.0.1:1", huge_limit).status().code(),
            absl::StatusCode::kInvalidArgument);

  ClientChannelOptions negative_keepalive;
  negative_keepalive.keepalive_time = absl::Seconds(-1);
  EXPECT_EQ(
      CreateClientChannel("127.0.0.1:1", negative_keepalive).status().code(),
      absl::StatusCode::kInvalidArgument);

  ClientChannelOptions no_timeout;
  no_timeout.keepalive_time = absl::Seconds(10);
  no_timeout.keepalive_timeout = absl::ZeroDuration();
  status = CreateClientChannel("127.0.0.1:1", no_timeout).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("keepalive_timeout"),
            absl::string_view::npos);
}

TEST(GrpcChannelTest, MissingCaFileIsNotFound) {
  ClientChannelOptions options;
  options.tls.ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(CreateClientChannel("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mneme
