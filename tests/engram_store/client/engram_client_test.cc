// The gRPC client against an in-process server and the in-process client
// answer identically; the gRPC client gives up on an unreachable store with
// Unavailable after its retries.

#include <memory>

#include "absl/time/clock.h"
#include "common/inflight_gate.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/engram_service.h"
#include "gtest/gtest.h"
#include "services/common/server_runner.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram {
namespace {

class EngramClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    synthetic::SyntheticCheckpointOptions options;
    options.out_dir = mneme::testing::MakeTempDir("client") + "/ckpt";
    options.seed = 9;
    options.threads = 2;
    ASSERT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
    EngramStoreOptions store_options;
    store_options.checkpoint_dir = options.out_dir;
    store_options.io_threads = 2;
    store_ = *EngramStore::Create(store_options);
    EngramServiceOptions service_options;
    service_options.limits.max_rows_per_request = 100;
    service_options.limits.max_stream_message_bytes = 3000;
    service_options.worker_threads = 2;
    service_ =
        *EngramService::Create(service_options, store_.get(), &gate_, nullptr);
    runner_ = *ServerRunner::Create(ServerOptions(), {service_.get()}, &gate_);
    GrpcEngramClientOptions client_options;
    client_options.target = runner_->address().ToString();
    grpc_ = *GrpcEngramClient::Create(client_options);
    in_process_ = std::make_unique<InProcessEngramClient>(
        store_.get(), service_options.limits);
  }
  void TearDown() override {
    if (runner_ != nullptr) runner_->Drain();
  }

  std::unique_ptr<EngramStore> store_;
  InflightGate gate_;
  std::unique_ptr<EngramService> service_;
  std::unique_ptr<ServerRunner> runner_;
  std::unique_ptr<GrpcEngramClient> grpc_;
  std::unique_ptr<InProcessEngramClient> in_process_;
};

TEST_F(EngramClientTest, GrpcAndInProcessAnswerAlike) {
  v1::LookupRequest request;
  request.set_layer_id(store_->checkpoint().tables()[0].layer);
  for (int i = 0; i < 30; ++i) request.add_token_ids(200 + 7 * i);
  request.set_context_token_count(27);
  request.set_encoding(v1::ROW_ENCODING_FP32);
  absl::StatusOr<v1::LookupResponse> a = grpc_->Lookup(request);
  absl::StatusOr<v1::LookupResponse> b = in_process_->Lookup(request);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
  EXPECT_EQ(a->row_ids_size(), 3 * 24);

  absl::StatusOr<v1::LookupResponse> s = grpc_->LookupStream(request);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->rows() == a->rows());
  EXPECT_EQ(s->row_ids_size(), a->row_ids_size());
  absl::StatusOr<v1::LookupResponse> t = in_process_->LookupStream(request);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->rows() == a->rows());

  absl::StatusOr<v1::DescribeResponse> d1 = grpc_->Describe();
  absl::StatusOr<v1::DescribeResponse> d2 = in_process_->Describe();
  ASSERT_TRUE(d1.ok() && d2.ok());
  EXPECT_EQ(d1->SerializeAsString(), d2->SerializeAsString());

  // Errors keep their codes through both.
  request.set_context_token_count(30);
  EXPECT_EQ(grpc_->Lookup(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(in_process_->Lookup(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.set_context_token_count(0);  // 30 x 24 rows > 100.
  EXPECT_EQ(grpc_->Lookup(request).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(in_process_->Lookup(request).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(grpc_->LookupStream(request).ok());
}

TEST_F(EngramClientTest, UnreachableStoreIsUnavailableAfterRetries) {
  runner_->Drain();
  runner_.reset();
  GrpcEngramClientOptions options;
  options.target = "127.0.0.1:1";  // Nothing listens there.
  options.timeout = absl::Seconds(5);
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(4);
  std::unique_ptr<GrpcEngramClient> client = *GrpcEngramClient::Create(options);
  EXPECT_EQ(client->Describe().status().code(), absl::StatusCode::kUnavailable);
}

TEST(GrpcEngramClientOptionsTest, RejectsBadOptions) {
  GrpcEngramClientOptions options;
  EXPECT_EQ(GrpcEngramClient::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.target = "127.0.0.1:1";
  options.max_attempts = 0;
  EXPECT_EQ(GrpcEngramClient::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.max_attempts = 1;
  options.timeout = absl::ZeroDuration();
  EXPECT_EQ(GrpcEngramClient::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::engram
