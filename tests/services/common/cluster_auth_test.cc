// Authentication of the internal hops: the worker, rendezvous and Engram
// store services on real 127.0.0.1 servers with --cluster_secret_file answer
// a call without the secret or with a wrong one UNAUTHENTICATED and serve it
// with the right one (also through the process's peer channel defaults, the
// way a worker's rendezvous and Engram clients get it); the health service
// stays open; and a worker refuses a Step or Release of a sequence created by
// another coordinator id (PERMISSION_DENIED) while its owner keeps it.

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cluster_secret.h"
#include "common/grpc_channel.h"
#include "common/inflight_gate.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/engram_service.h"
#include "gmock/gmock.h"
#include "gpu/comm/grpc_rendezvous_store.h"
#include "gpu/comm/rendezvous_service.h"
#include "gtest/gtest.h"
#include "proto/comm/v1/rendezvous.grpc.pb.h"
#include "proto/engram/v1/engram_store.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "services/common/server_runner.h"
#include "services/worker/local_model.h"
#include "services/worker/worker_service.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tls_certs.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";
constexpr char kWrongSecret[] = "0123456789abcdef0123456789abcdee";
constexpr char kNextSecret[] = "fedcba9876543210fedcba9876543210";

std::string WriteFile(const std::string& name, const std::string& text) {
  static const std::string* dir =
      new std::string(mneme::testing::MakeTempDir("auth"));
  std::string path = absl::StrCat(*dir, "/", name);
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

const std::string& TinyCheckpoint() {
  static const std::string* dir = [] {
    auto* d = new std::string(mneme::testing::MakeTempDir("tiny") + "/ckpt");
    synthetic::ReleaseCheckpointOptions o;
    o.threads = 1;
    o.out_dir = *d;
    o.seed = 5;
    const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
    EXPECT_TRUE(st.ok()) << st;
    return d;
  }();
  return *dir;
}

// A channel to `runner` sending the first secret of `secret_file` ("" =
// no secret).
std::shared_ptr<grpc::Channel> Channel(const ServerRunner& runner,
                                       const std::string& secret_file) {
  ClientChannelOptions options;
  options.cluster_secret_file = secret_file;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateClientChannel(runner.address().ToString(), options);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return *channel;
}

ServerOptions WithSecret() {
  ServerOptions options;
  options.cluster_secret_file =
      WriteFile("server_secret", absl::StrCat(kSecret, "\n"));
  return options;
}

// The standard health service answers without the secret (for probes).
void ExpectHealthOpen(const ServerRunner& runner) {
  auto stub = grpc::health::v1::Health::NewStub(Channel(runner, ""));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status st = stub->Check(&context, {}, &response);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

class SecretFiles : public ::testing::Test {
 protected:
  std::string right_ = WriteFile("right", absl::StrCat(kSecret, "\n"));
  std::string wrong_ = WriteFile("wrong", absl::StrCat(kWrongSecret, "\n"));
};

TEST_F(SecretFiles, WorkerServiceNeedsTheSecret) {
  worker::LocalModelOptions lo;
  lo.checkpoint_dir = TinyCheckpoint();
  lo.threads = 1;
  lo.model.kv_cache.budget_bytes = 16 << 20;
  auto local = worker::LocalModel::Create(lo);
  ASSERT_TRUE(local.ok()) << local.status();
  InflightGate gate;
  auto service = worker::WorkerService::Create({}, &gate);
  ASSERT_TRUE(service.ok()) << service.status();
  (*service)->Attach(&(*local)->model(), &(*local)->backend(), nullptr);
  auto runner = ServerRunner::Create(WithSecret(), {service->get()}, &gate);
  ASSERT_TRUE(runner.ok()) << runner.status();

  for (const std::string& file : {std::string(), wrong_}) {
    auto stub = worker::v1::Worker::NewStub(Channel(**runner, file));
    grpc::ClientContext context;
    worker::v1::GetInfoResponse info;
    const grpc::Status st = stub->GetInfo(&context, {}, &info);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << "secret file '" << file << "': " << st.error_message();
    grpc::ClientContext release_context;
    worker::v1::ReleaseRequest release;
    release.add_sequence_ids(1);
    worker::v1::ReleaseResponse released;
    EXPECT_EQ(stub->Release(&release_context, release, &released).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  auto stub = worker::v1::Worker::NewStub(Channel(**runner, right_));
  grpc::ClientContext context;
  worker::v1::GetInfoResponse info;
  const grpc::Status st = stub->GetInfo(&context, {}, &info);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(info.tp_size(), 1);
  ExpectHealthOpen(**runner);
  (*runner)->Drain();
}

TEST_F(SecretFiles, RendezvousServiceNeedsTheSecret) {
  InflightGate gate;
  auto service = gpu::RendezvousService::Create({}, &gate);
  ASSERT_TRUE(service.ok()) << service.status();
  auto runner = ServerRunner::Create(WithSecret(), {service->get()}, &gate);
  ASSERT_TRUE(runner.ok()) << runner.status();

  for (const std::string& file : {std::string(), wrong_}) {
    auto stub = comm::v1::Rendezvous::NewStub(Channel(**runner, file));
    grpc::ClientContext set_context;
    comm::v1::SetRequest set;
    set.set_key("g/rank0");
    set.set_value("hostile");
    comm::v1::SetResponse set_response;
    EXPECT_EQ(stub->Set(&set_context, set, &set_response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext get_context;
    comm::v1::GetRequest get;
    get.add_keys("g/rank0");
    comm::v1::GetResponse get_response;
    EXPECT_EQ(stub->Get(&get_context, get, &get_response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Nothing was stored by the refused calls.
  EXPECT_FALSE((*service)->store().Get({"g/rank0"}, absl::ZeroDuration()).ok());

  // A worker's client: no secret in its own options, the process default.
  gpu::GrpcRendezvousStoreOptions options;
  options.target = (*runner)->address().ToString();
  options.key_prefix = "g/";
  options.rpc_timeout = absl::Seconds(10);
  {
    auto client = gpu::GrpcRendezvousStore::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_EQ((*client)->Set("rank0", "x").code(),
              absl::StatusCode::kUnauthenticated);
  }
  ClientChannelOptions defaults;
  defaults.cluster_secret_file = right_;
  SetPeerChannelDefaults(defaults);
  {
    auto client = gpu::GrpcRendezvousStore::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_TRUE((*client)->Set("rank0", "10.0.0.1:1234").ok());
    auto values = (*client)->Get({"rank0"}, absl::ZeroDuration());
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_EQ(values->at(0), "10.0.0.1:1234");
  }
  SetPeerChannelDefaults({});
  ExpectHealthOpen(**runner);
  (*runner)->Drain();
}

TEST_F(SecretFiles, EngramStoreNeedsTheSecret) {
  synthetic::ReleaseCheckpointOptions checkpoint;
  checkpoint.out_dir = mneme::testing::MakeTempDir("engram") + "/ckpt";
  checkpoint.seed = 9;
  checkpoint.threads = 2;
  ASSERT_TRUE(synthetic::MakeReleaseCheckpoint(checkpoint).ok());
  engram::EngramStoreOptions store_options;
  store_options.checkpoint_dir = checkpoint.out_dir;
  store_options.io_threads = 2;
  auto store = engram::EngramStore::Create(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  InflightGate gate;
  engram::EngramServiceOptions service_options;
  service_options.worker_threads = 2;
  auto service = engram::EngramService::Create(service_options, store->get(),
                                               &gate, nullptr);
  ASSERT_TRUE(service.ok()) << service.status();
  auto runner = ServerRunner::Create(WithSecret(), {service->get()}, &gate);
  ASSERT_TRUE(runner.ok()) << runner.status();

  engram::v1::LookupRequest lookup;
  lookup.set_layer_id((*store)->checkpoint().tables()[0].layer);
  for (int i = 0; i < 4; ++i) lookup.add_token_ids(200 + i);
  lookup.set_encoding(engram::v1::ROW_ENCODING_FP32);
  for (const std::string& file : {std::string(), wrong_}) {
    auto stub = engram::v1::EngramStore::NewStub(Channel(**runner, file));
    grpc::ClientContext context;
    engram::v1::DescribeResponse described;
    EXPECT_EQ(stub->Describe(&context, {}, &described).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext lookup_context;
    engram::v1::LookupResponse rows;
    EXPECT_EQ(stub->Lookup(&lookup_context, lookup, &rows).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext stream_context;
    auto reader = stub->LookupStream(&stream_context, lookup);
    while (reader->Read(&rows)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  auto stub = engram::v1::EngramStore::NewStub(Channel(**runner, right_));
  grpc::ClientContext context;
  engram::v1::LookupResponse rows;
  const grpc::Status st = stub->Lookup(&context, lookup, &rows);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_GT(rows.row_ids_size(), 0);

  // A worker's Engram client takes the process default.
  ClientChannelOptions defaults;
  defaults.cluster_secret_file = right_;
  SetPeerChannelDefaults(defaults);
  engram::GrpcEngramClientOptions client_options;
  client_options.target = (*runner)->address().ToString();
  auto client = engram::GrpcEngramClient::Create(client_options);
  SetPeerChannelDefaults({});
  ASSERT_TRUE(client.ok()) << client.status();
  auto described = (*client)->Describe();
  EXPECT_TRUE(described.ok()) << described.status();
  ExpectHealthOpen(**runner);
  (*runner)->Drain();
}

TEST_F(SecretFiles, PeerDefaultsCarryMutualTlsAndTheSecret) {
  absl::StatusOr<mneme::testing::TlsCerts> certs =
      mneme::testing::GenerateTlsCerts();
  ASSERT_TRUE(certs.ok()) << certs.status();
  InflightGate gate;
  auto service = gpu::RendezvousService::Create({}, &gate);
  ASSERT_TRUE(service.ok()) << service.status();
  ServerOptions server = WithSecret();
  server.tls.cert_file = certs->server_cert;
  server.tls.key_file = certs->server_key;
  server.tls.client_ca_file = certs->ca_cert;
  auto runner = ServerRunner::Create(server, {service->get()}, &gate);
  ASSERT_TRUE(runner.ok()) << runner.status();

  // The rendezvous client as a worker builds it: nothing in its own options.
  gpu::GrpcRendezvousStoreOptions options;
  options.target = (*runner)->address().ToString();
  options.key_prefix = "g/";
  options.rpc_timeout = absl::Seconds(5);
  auto set_with = [&](const ClientChannelOptions& defaults) {
    SetPeerChannelDefaults(defaults);
    auto client = gpu::GrpcRendezvousStore::Create(options);
    SetPeerChannelDefaults({});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? (*client)->Set("k", "v") : client.status();
  };
  ClientChannelOptions full;
  full.tls.ca_file = certs->ca_cert;
  full.tls.cert_file = certs->client_cert;
  full.tls.key_file = certs->client_key;
  full.cluster_secret_file = right_;
  EXPECT_TRUE(set_with(full).ok());
  ClientChannelOptions no_secret = full;
  no_secret.cluster_secret_file.clear();
  EXPECT_EQ(set_with(no_secret).code(), absl::StatusCode::kUnauthenticated);
  ClientChannelOptions no_client_cert = full;
  no_client_cert.tls.cert_file.clear();
  no_client_cert.tls.key_file.clear();
  EXPECT_FALSE(set_with(no_client_cert).ok());
  ClientChannelOptions plaintext;
  plaintext.cluster_secret_file = right_;
  EXPECT_FALSE(set_with(plaintext).ok());
  (*runner)->Drain();
}

TEST_F(SecretFiles, EitherSecretOfARotatingServerIsAccepted) {
  InflightGate gate;
  auto service = gpu::RendezvousService::Create({}, &gate);
  ASSERT_TRUE(service.ok()) << service.status();
  ServerOptions options;
  options.cluster_secret_file = WriteFile(
      "rotating", absl::StrCat(kNextSecret, "\r\n", kSecret, "  \n\n"));
  auto runner = ServerRunner::Create(options, {service->get()}, &gate);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::string next = WriteFile("next", kNextSecret);
  for (const std::string& file : {right_, next, wrong_}) {
    auto stub = comm::v1::Rendezvous::NewStub(Channel(**runner, file));
    grpc::ClientContext context;
    comm::v1::SetRequest set;
    set.set_key("k");
    set.set_value("v");
    comm::v1::SetResponse response;
    EXPECT_EQ(stub->Set(&context, set, &response).ok(), file != wrong_) << file;
  }
  (*runner)->Drain();
}

TEST_F(SecretFiles, AnUnreadableOrInvalidSecretFileIsRefused) {
  InflightGate gate;
  ServerOptions options;
  options.cluster_secret_file = "/nonexistent/secret";
  EXPECT_EQ(ServerRunner::Create(options, {}, &gate).status().code(),
            absl::StatusCode::kNotFound);
  options.cluster_secret_file = WriteFile("short", "tooshort\n");
  EXPECT_EQ(ServerRunner::Create(options, {}, &gate).status().code(),
            absl::StatusCode::kInvalidArgument);
  ClientChannelOptions client;
  client.cluster_secret_file = options.cluster_secret_file;
  EXPECT_EQ(CreateClientChannel("127.0.0.1:1", client).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ClusterSecretTest, FilesAreValidated) {
  auto secrets = ReadClusterSecretFile(
      WriteFile("two", absl::StrCat(kSecret, "\n", kNextSecret, "\n")));
  ASSERT_TRUE(secrets.ok()) << secrets.status();
  EXPECT_EQ(*secrets, (std::vector<std::string>{kSecret, kNextSecret}));
  for (const std::string& text :
       {std::string(), std::string("\n\n"),
        absl::StrCat(kSecret, "\n", kSecret, "\n", kSecret),
        std::string("with a space 0123456789"), std::string(2000, 'a'),
        std::string("0123456789abcdef\x01")}) {
    const absl::Status st =
        ReadClusterSecretFile(WriteFile("bad", text)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(st.message(), HasSubstr("--cluster_secret_file"));
  }
  EXPECT_TRUE(ConstantTimeEquals(kSecret, kSecret));
  EXPECT_FALSE(ConstantTimeEquals(kSecret, kWrongSecret));
  EXPECT_FALSE(ConstantTimeEquals(kSecret, absl::StrCat(kSecret, "x")));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

class OwnershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    worker::LocalModelOptions lo;
    lo.checkpoint_dir = TinyCheckpoint();
    lo.threads = 1;
    lo.model.kv_cache.budget_bytes = 16 << 20;
    auto local = worker::LocalModel::Create(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = *std::move(local);
    auto service = worker::WorkerService::Create({}, &gate_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    service_->Attach(&local_->model(), &local_->backend(), nullptr);
    auto runner =
        ServerRunner::Create(ServerOptions(), {service_.get()}, &gate_);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    stub_ = worker::v1::Worker::NewStub(Channel(*runner_, ""));
  }
  void TearDown() override { runner_->Drain(); }

  grpc::Status Step(const std::string& coordinator, uint64_t sequence,
                    int64_t position,
                    const std::vector<uint64_t>& release = {}) {
    worker::v1::StepRequest request;
    request.set_coordinator_id(coordinator);
    worker::v1::SequenceChunk* c = request.add_chunks();
    c->set_sequence_id(sequence);
    c->add_token_ids(5);
    c->add_token_ids(9);
    c->set_start_position(position);
    c->set_output(worker::v1::OUTPUT_SAMPLE);
    for (uint64_t id : release) request.add_release_sequence_ids(id);
    grpc::ClientContext context;
    worker::v1::StepResponse response;
    return stub_->Step(&context, request, &response);
  }

  grpc::Status Release(const std::string& coordinator, uint64_t sequence) {
    worker::v1::ReleaseRequest request;
    request.set_coordinator_id(coordinator);
    request.add_sequence_ids(sequence);
    grpc::ClientContext context;
    worker::v1::ReleaseResponse response;
    return stub_->Release(&context, request, &response);
  }

  std::unique_ptr<worker::LocalModel> local_;
  InflightGate gate_;
  std::unique_ptr<worker::WorkerService> service_;
  std::unique_ptr<ServerRunner> runner_;
  std::unique_ptr<worker::v1::Worker::Stub> stub_;
};

TEST_F(OwnershipTest, OnlyTheCreatingCoordinatorRunsOrReleasesASequence) {
  ASSERT_TRUE(Step("coord-a", 7, 0).ok());
  // Another coordinator can neither release it, nor run it, nor release it
  // inside a step.
  grpc::Status st = Release("coord-b", 7);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("sequence 7"));
  EXPECT_EQ(Step("coord-b", 7, 2).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Step("coord-b", 8, 0, {7}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The refusals left the worker usable and the sequence intact: its owner
  // (or a restart of it, which keeps the id) continues it at position 2.
  EXPECT_TRUE(service_->broken().ok());
  EXPECT_TRUE(Step("coord-a", 7, 2).ok());
  // The refused step created nothing: sequence 8 is free for anyone.
  EXPECT_TRUE(Step("coord-c", 8, 0).ok());
  EXPECT_TRUE(Release("coord-c", 8).ok());
  // Once its owner released it, the id may be reused by another one.
  EXPECT_TRUE(Release("coord-a", 7).ok());
  EXPECT_TRUE(Step("coord-b", 7, 0).ok());
  // Unknown sequences are released by anyone (a no-op).
  EXPECT_TRUE(Release("coord-a", 12345).ok());
  EXPECT_EQ(Release(std::string(300, 'x'), 1).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace mneme
