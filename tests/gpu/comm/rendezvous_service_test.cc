// The Rendezvous gRPC service on a real 127.0.0.1 server (port 0) with
// GrpcRendezvousStore clients.
#include "gpu/comm/rendezvous_service.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/time.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/inflight_gate.h"
#include "gmock/gmock.h"
#include "gpu/comm/grpc_rendezvous_store.h"
#include "gtest/gtest.h"
#include "proto/comm/v1/rendezvous.grpc.pb.h"
#include "services/common/server_runner.h"

namespace mneme::gpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class RendezvousServiceTest : public ::testing::Test {
 protected:
  void StartServer(const RendezvousServiceOptions& options = {}) {
    auto service = RendezvousService::Create(options, &gate_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    auto runner =
        ServerRunner::Create(ServerOptions(), {service_.get()}, &gate_);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  std::unique_ptr<GrpcRendezvousStore> Client(
      const std::string& prefix = "group-1/gen-1/") {
    GrpcRendezvousStoreOptions options;
    options.target = runner_->address().ToString();
    options.key_prefix = prefix;
    options.rpc_timeout = absl::Seconds(10);
    auto client = GrpcRendezvousStore::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  // Waits (bounded by the test's own timeout) until `n` Gets are parked.
  void AwaitWaiting(int64_t n) {
    while (service_->store().waiting_gets() != n) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  InflightGate gate_;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<ServerRunner> runner_;
};

TEST_F(RendezvousServiceTest, SetThenGet) {
  StartServer();
  auto client = Client();
  const std::string binary("\0\1\2\xff", 4);
  ASSERT_TRUE(client->Set("a", "alpha").ok());
  ASSERT_TRUE(client->Set("b", binary).ok());
  auto values = client->Get({"b", "a"}, absl::ZeroDuration());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre(binary, "alpha"));
  // The prefix is part of the stored key.
  auto direct =
      service_->store().Get({"group-1/gen-1/a"}, absl::ZeroDuration());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_THAT(*direct, ElementsAre("alpha"));
}

TEST_F(RendezvousServiceTest, WaitingGetIsSatisfiedByALaterSet) {
  StartServer();
  auto getter = Client();
  auto setter = Client();
  absl::StatusOr<std::vector<std::string>> values;
  std::thread t([&] {
    values = getter->Get({"rank/0", "rank/1"}, absl::Seconds(60));
  });
  AwaitWaiting(1);
  ASSERT_TRUE(setter->Set("rank/1", "one").ok());
  ASSERT_TRUE(setter->Set("rank/0", "zero").ok());
  t.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("zero", "one"));
  EXPECT_EQ(service_->store().waiting_gets(), 0);
}

TEST_F(RendezvousServiceTest, GetTimesOutWithDeadlineExceeded) {
  StartServer();
  auto client = Client();
  auto values = client->Get({"never"}, absl::Milliseconds(100));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  // The server ended the wait, naming the key.
  EXPECT_THAT(values.status().message(), HasSubstr("never"));
  EXPECT_EQ(service_->store().waiting_gets(), 0);
}

TEST_F(RendezvousServiceTest, ServerCapsTheWait) {
  RendezvousServiceOptions options;
  options.max_wait = absl::Milliseconds(50);
  StartServer(options);
  auto values = Client()->Get({"never"}, absl::Hours(1));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousServiceTest, OverBudgetIsResourceExhausted) {
  RendezvousServiceOptions options;
  options.store.max_total_bytes = 64;
  StartServer(options);
  auto client = Client("p/");
  ASSERT_TRUE(client->Set("k1", std::string(40, 'x')).ok());
  const absl::Status s = client->Set("k2", std::string(40, 'y'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(RendezvousServiceTest, OversizedValueIsInvalidArgument) {
  RendezvousServiceOptions options;
  options.store.max_value_bytes = 16;
  StartServer(options);
  EXPECT_EQ(Client()->Set("k", std::string(17, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client()->Get({}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RendezvousServiceTest, PrefixesKeepGroupsApart) {
  StartServer();
  ASSERT_TRUE(Client("gen-1/")->Set("rank/0", "old").ok());
  auto values = Client("gen-2/")->Get({"rank/0"}, absl::ZeroDuration());
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(RendezvousServiceTest, CancelledCallReleasesItsWait) {
  StartServer();
  auto stub = comm::v1::Rendezvous::NewStub(grpc::CreateChannel(
      runner_->address().ToString(), grpc::InsecureChannelCredentials()));
  comm::v1::GetRequest request;
  request.add_keys("never");
  request.set_timeout_ms(600000);
  comm::v1::GetResponse response;
  grpc::ClientContext context;
  // The call deadline ends the call long before the requested wait.
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
  const grpc::Status s = stub->Get(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  AwaitWaiting(0);
}

TEST_F(RendezvousServiceTest, DrainingServerIsUnavailable) {
  StartServer();
  auto client = Client();
  gate_.BeginDrain();
  EXPECT_EQ(client->Set("k", "v").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->Get({"k"}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(RendezvousServiceTest, UnreachableServerIsDeadlineExceeded) {
  StartServer();
  const std::string target = runner_->address().ToString();
  runner_->Drain();
  runner_.reset();
  GrpcRendezvousStoreOptions options;
  options.target = target;
  options.key_prefix = "p/";
  options.rpc_timeout = absl::Milliseconds(200);
  auto client = GrpcRendezvousStore::Create(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->Set("k", "v").code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(RendezvousServiceCreateTest, RejectsBadOptions) {
  InflightGate gate;
  RendezvousServiceOptions options;
  options.max_wait = absl::ZeroDuration();
  EXPECT_EQ(RendezvousService::Create(options, &gate).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.store.max_total_bytes = 0;
  auto service = RendezvousService::Create(options, &gate);
  EXPECT_EQ(service.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(service.status().message(), HasSubstr("store.max_total_bytes"));
  EXPECT_EQ(RendezvousService::Create({}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GrpcRendezvousStoreCreateTest, RejectsBadOptions) {
  GrpcRendezvousStoreOptions options;
  options.key_prefix = "p/";
  EXPECT_EQ(GrpcRendezvousStore::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.target = "127.0.0.1:1";
  options.key_prefix = "";
  EXPECT_EQ(GrpcRendezvousStore::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.key_prefix = "p/";
  options.rpc_timeout = absl::ZeroDuration();
  EXPECT_EQ(GrpcRendezvousStore::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::gpu
