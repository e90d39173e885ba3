// The shared-memory transport against a real store: a ShmEngramServer on a
// real Unix socket and memfd, the client in the same process. It answers as
// the in-process client does (rows, ids, errors), in several pieces when a
// lookup outgrows the shared area; it survives the faults of the gRPC path
// (the server gone, restarted, stalled) and malformed messages, and falls
// back to another client while the socket cannot be reached.

#include "engram_store/client/shm_engram_client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/inflight_gate.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/request_handler.h"
#include "engram_store/service/shm_server.h"
#include "engram_store/shm/shm_wire.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram {
namespace {

class ShmEngramClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    synthetic::SyntheticCheckpointOptions options;
    options.out_dir = mneme::testing::MakeTempDir("shm") + "/ckpt";
    options.seed = 9;
    options.threads = 2;
    ASSERT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
    EngramStoreOptions store_options;
    store_options.checkpoint_dir = options.out_dir;
    store_options.io_threads = 2;
    store_ = EngramStore::Create(store_options)->release();
    options.out_dir = mneme::testing::MakeTempDir("shm") + "/nvfp4";
    options.engram_format = formats::RowFormat::kNvfp4;
    ASSERT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
    store_options.checkpoint_dir = options.out_dir;
    nvfp4_store_ = EngramStore::Create(store_options)->release();
  }

  void SetUp() override {
    limits_.max_rows_per_request = 100;
    handler_ = std::make_unique<RequestHandler>(store_, limits_);
    in_process_ = std::make_unique<InProcessEngramClient>(store_, limits_);
    // Short: Unix socket paths are at most 107 bytes.
    socket_path_ = absl::StrCat("/tmp/mneme-shm-test-", getpid(), "-",
                                sockets_++, ".sock");
    StartServer();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  void StartServer(uint64_t response_bytes = uint64_t{1} << 20) {
    ShmServerOptions options;
    options.socket_path = socket_path_;
    options.response_bytes = response_bytes;
    options.request_bytes = 64 << 10;
    absl::StatusOr<std::unique_ptr<ShmEngramServer>> server =
        ShmEngramServer::Create(options, handler_.get(), &gate_, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<ShmEngramClient> Client(int max_attempts = 4,
                                          EngramClient* fallback = nullptr) {
    ShmEngramClientOptions options;
    options.socket_path = socket_path_;
    options.timeout = absl::Seconds(5);
    options.max_attempts = max_attempts;
    options.initial_backoff = absl::Milliseconds(20);
    options.fallback = fallback;
    options.reconnect_interval = absl::Milliseconds(100);
    absl::StatusOr<std::unique_ptr<ShmEngramClient>> client =
        ShmEngramClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  v1::LookupRequest TokenRequest(int tokens, v1::RowEncoding encoding) const {
    v1::LookupRequest request;
    request.set_layer_id(store_->checkpoint().tables()[0].layer);
    for (int i = 0; i < tokens + 3; ++i) request.add_token_ids(200 + 7 * i);
    request.set_context_token_count(3);
    request.set_encoding(encoding);
    return request;
  }

  // A socket listening on the server's path (the server shut down), or -1.
  int Listen() const {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
    if (fd < 0 ||
        bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd, 4) != 0) {
      ADD_FAILURE() << "cannot listen on " << socket_path_;
      if (fd >= 0) close(fd);
      return -1;
    }
    return fd;
  }

  // A raw connection to the server: its fd after the Hello; *area is the
  // mapped area.
  int RawConnect(uint8_t** area) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    shm::Hello hello;
    int memfd = -1;
    EXPECT_TRUE(shm::Receive(fd, &hello, sizeof(hello),
                             absl::Now() + absl::Seconds(5), &memfd)
                    .ok());
    *area = *shm::MapArea(
        memfd, shm::kControlBytes + hello.request_bytes + hello.response_bytes);
    close(memfd);
    return fd;
  }

  static EngramStore* store_;
  static EngramStore* nvfp4_store_;
  static int sockets_;
  RequestLimits limits_;
  std::unique_ptr<RequestHandler> handler_;
  std::unique_ptr<InProcessEngramClient> in_process_;
  InflightGate gate_;
  std::string socket_path_;
  std::unique_ptr<ShmEngramServer> server_;
};

EngramStore* ShmEngramClientTest::store_ = nullptr;
EngramStore* ShmEngramClientTest::nvfp4_store_ = nullptr;
int ShmEngramClientTest::sockets_ = 0;

TEST_F(ShmEngramClientTest, AnswersAsTheInProcessClient) {
  std::unique_ptr<ShmEngramClient> client = Client();
  for (v1::RowEncoding encoding :
       {v1::ROW_ENCODING_BF16, v1::ROW_ENCODING_FP32}) {
    const v1::LookupRequest request = TokenRequest(4, encoding);
    absl::StatusOr<v1::LookupResponse> a = client->Lookup(request);
    absl::StatusOr<v1::LookupResponse> b = in_process_->Lookup(request);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
    EXPECT_TRUE(client->last_call_used_shared_memory());

    std::vector<uint8_t> rows(b->rows().size());
    absl::StatusOr<int32_t> row_dim =
        client->LookupInto(request, false, absl::MakeSpan(rows));
    ASSERT_TRUE(row_dim.ok()) << row_dim.status();
    EXPECT_EQ(*row_dim, b->row_dim());
    EXPECT_EQ(std::string(rows.begin(), rows.end()), b->rows());
    // The wrong output size is DataLoss naming both sizes.
    rows.resize(rows.size() - 1);
    EXPECT_EQ(client->LookupInto(request, false, absl::MakeSpan(rows))
                  .status()
                  .code(),
              absl::StatusCode::kDataLoss);
  }
  // Row ids.
  v1::LookupRequest ids;
  ids.set_layer_id(store_->checkpoint().tables()[0].layer);
  for (int64_t id : {0, 5, 5, 17}) ids.add_row_ids(id);
  absl::StatusOr<v1::LookupResponse> a = client->Lookup(ids);
  absl::StatusOr<v1::LookupResponse> b = in_process_->Lookup(ids);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());

  absl::StatusOr<v1::DescribeResponse> d1 = client->Describe();
  absl::StatusOr<v1::DescribeResponse> d2 = in_process_->Describe();
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(d1->SerializeAsString(), d2->SerializeAsString());

  v1::PrefetchRequest prefetch;
  prefetch.set_layer_id(ids.layer_id());
  prefetch.add_row_ids(3);
  EXPECT_TRUE(client->Prefetch(prefetch).ok());
}

// LookupInto asks the store for raw rows and decodes them in the caller's
// buffer: the bits equal the store's own decode, for FP8 and NVFP4 tables,
// every table, every encoding (raw rows come as stored), in one piece and in
// several.
TEST_F(ShmEngramClientTest, LookupIntoDecodesAsTheStoreDoes) {
  for (EngramStore* store : {store_, nvfp4_store_}) {
    for (uint64_t response_bytes : {uint64_t{1} << 20, uint64_t{8192}}) {
      SCOPED_TRACE(absl::StrCat(store == store_ ? "FP8" : "NVFP4",
                                " tables, a ", response_bytes, "-byte area"));
      server_->Shutdown();
      handler_ = std::make_unique<RequestHandler>(store, limits_);
      StartServer(response_bytes);
      InProcessEngramClient in_process(store, limits_);
      std::unique_ptr<ShmEngramClient> client = Client();
      for (const checkpoint::EngramTableLocation& table :
           store->checkpoint().tables()) {
        for (v1::RowEncoding encoding :
             {v1::ROW_ENCODING_UNSPECIFIED, v1::ROW_ENCODING_BF16,
              v1::ROW_ENCODING_FP32, v1::ROW_ENCODING_RAW}) {
          v1::LookupRequest request = TokenRequest(3, encoding);
          request.set_layer_id(table.layer);
          absl::StatusOr<v1::LookupResponse> want = in_process.Lookup(request);
          ASSERT_TRUE(want.ok()) << want.status();
          std::vector<uint8_t> rows(want->rows().size());
          absl::StatusOr<int32_t> row_dim =
              client->LookupInto(request, false, absl::MakeSpan(rows));
          ASSERT_TRUE(row_dim.ok()) << row_dim.status();
          EXPECT_TRUE(client->last_call_used_shared_memory());
          EXPECT_EQ(*row_dim, want->row_dim());
          EXPECT_EQ(std::string(rows.begin(), rows.end()), want->rows())
              << "layer " << table.layer << " encoding "
              << v1::RowEncoding_Name(encoding);
        }
      }
    }
  }
}

// The doorbell rule: a sender rings only a receiver blocked on the socket
// (no system call while both sides spin or work), and a blocked one is
// woken.
TEST(ShmWireTest, DoorbellsRingOnlyABlockedReceiver) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets), 0);
  auto control = std::make_unique<shm::Control>();
  auto pending = [&] {
    char byte = 0;
    return recv(sockets[1], &byte, 1, MSG_DONTWAIT) == 1;
  };
  // A receiver busy elsewhere (not blocked): the message, no doorbell.
  ASSERT_TRUE(shm::Post(sockets[0], control->call, control->calls_posted,
                        control->store_blocked, shm::Call{})
                  .ok());
  EXPECT_FALSE(pending());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  EXPECT_TRUE(shm::Await(sockets[1], control->calls_posted, 0,
                         control->store_blocked, absl::ZeroDuration(), deadline)
                  .ok());
  EXPECT_EQ(control->store_blocked.load(), 0u);
  // A receiver blocked in Await (no spinning) is woken by its doorbell.
  std::atomic<bool> woke{false};
  std::thread receiver([&] {
    EXPECT_TRUE(shm::Await(sockets[1], control->calls_posted, 1,
                           control->store_blocked, absl::ZeroDuration(),
                           deadline)
                    .ok());
    woke = true;
  });
  while (control->store_blocked.load() == 0)
    absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(woke.load());
  ASSERT_TRUE(shm::Post(sockets[0], control->call, control->calls_posted,
                        control->store_blocked, shm::Call{})
                  .ok());
  receiver.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(control->store_blocked.load(), 0u);
  close(sockets[0]);
  close(sockets[1]);
}

TEST_F(ShmEngramClientTest, ErrorsAreTheHandlersAndKeepTheConnection) {
  std::unique_ptr<ShmEngramClient> client = Client();
  v1::LookupRequest bad = TokenRequest(2, v1::ROW_ENCODING_BF16);
  bad.set_layer_id(12345);
  const absl::Status a = client->Lookup(bad).status();
  const absl::Status b = in_process_->Lookup(bad).status();
  EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a, b);
  // Too many rows for one Lookup: ResourceExhausted, as in-process.
  const v1::LookupRequest big = TokenRequest(50, v1::ROW_ENCODING_BF16);
  EXPECT_EQ(client->Lookup(big).status(), in_process_->Lookup(big).status());
  EXPECT_TRUE(client->Lookup(TokenRequest(2, v1::ROW_ENCODING_BF16)).ok());
  EXPECT_EQ(server_->connections(), 1);
}

TEST_F(ShmEngramClientTest, LargeLookupsComeInPiecesThroughASmallArea) {
  server_->Shutdown();
  // 8 KiB: 15 bf16 rows (512 bytes + an 8-byte id) a piece.
  StartServer(8192);
  std::unique_ptr<ShmEngramClient> client = Client();
  const v1::LookupRequest request = TokenRequest(40, v1::ROW_ENCODING_BF16);
  absl::StatusOr<v1::LookupResponse> a = client->LookupStream(request);
  absl::StatusOr<v1::LookupResponse> b = in_process_->LookupStream(request);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_GT(b->row_ids_size(), 15 * 4);
  EXPECT_EQ(a->rows(), b->rows());
  EXPECT_EQ(a->row_ids_size(), b->row_ids_size());
  std::vector<uint8_t> rows(b->rows().size());
  ASSERT_TRUE(client->LookupInto(request, true, absl::MakeSpan(rows)).ok());
  EXPECT_EQ(std::string(rows.begin(), rows.end()), b->rows());
}

TEST_F(ShmEngramClientTest, ServerGoneThenRestartedOnTheSamePath) {
  std::unique_ptr<ShmEngramClient> client = Client(/*max_attempts=*/2);
  const v1::LookupRequest request = TokenRequest(3, v1::ROW_ENCODING_BF16);
  ASSERT_TRUE(client->Lookup(request).ok());
  server_->Shutdown();
  EXPECT_EQ(client->Lookup(request).status().code(),
            absl::StatusCode::kUnavailable);
  StartServer();
  // A fresh connection, the same answer.
  absl::StatusOr<v1::LookupResponse> a = client->Lookup(request);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->SerializeAsString(),
            in_process_->Lookup(request)->SerializeAsString());
}

TEST_F(ShmEngramClientTest, UnreachableSocketUsesTheFallback) {
  server_->Shutdown();
  std::unique_ptr<ShmEngramClient> client = Client(4, in_process_.get());
  const v1::LookupRequest request = TokenRequest(3, v1::ROW_ENCODING_BF16);
  absl::StatusOr<v1::LookupResponse> a = client->Lookup(request);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(client->last_call_used_shared_memory());
  StartServer();
  absl::SleepFor(absl::Milliseconds(150));  // past reconnect_interval
  ASSERT_TRUE(client->Lookup(request).ok());
  EXPECT_TRUE(client->last_call_used_shared_memory());
}

// A store of another protocol version (a rolling upgrade) is as good as
// unreachable: the gRPC fallback serves.
TEST_F(ShmEngramClientTest, AStoreOfAnotherProtocolVersionUsesTheFallback) {
  server_->Shutdown();
  const int listener = Listen();
  ASSERT_GE(listener, 0);
  // Answers every connection with a Hello of version kVersion - 1.
  std::thread old_store([&] {
    for (;;) {
      const int fd = accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      shm::Hello hello;
      hello.version = shm::kVersion - 1;
      hello.request_bytes = hello.response_bytes = 1 << 16;
      absl::StatusOr<int> memfd =
          shm::CreateArea(shm::kControlBytes + (2 << 16));
      if (memfd.ok()) {
        (void)shm::Send(fd, &hello, sizeof(hello), *memfd);
        close(*memfd);
      }
      close(fd);
    }
  });
  std::unique_ptr<ShmEngramClient> client = Client(2, in_process_.get());
  absl::StatusOr<v1::LookupResponse> a =
      client->Lookup(TokenRequest(3, v1::ROW_ENCODING_BF16));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(client->last_call_used_shared_memory());
  // Without a fallback: Unavailable, naming the versions.
  std::unique_ptr<ShmEngramClient> alone = Client(1);
  const absl::Status s =
      alone->Lookup(TokenRequest(3, v1::ROW_ENCODING_BF16)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("protocol version"), std::string::npos) << s;
  shutdown(listener, SHUT_RDWR);
  old_store.join();
  close(listener);
  unlink(socket_path_.c_str());
  server_.reset();
}

TEST_F(ShmEngramClientTest, AStalledStoreIsADeadline) {
  server_->Shutdown();
  // Something listens on the path but never answers (a stopped store).
  const int fd = Listen();
  ASSERT_GE(fd, 0);
  ShmEngramClientOptions options;
  options.socket_path = socket_path_;
  options.timeout = absl::Milliseconds(300);
  std::unique_ptr<ShmEngramClient> client = *ShmEngramClient::Create(options);
  const absl::Time start = absl::Now();
  EXPECT_EQ(
      client->Lookup(TokenRequest(2, v1::ROW_ENCODING_BF16)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);
  unlink(socket_path_.c_str());
}

TEST_F(ShmEngramClientTest, MalformedMessagesCloseOnlyTheirConnection) {
  struct Case {
    const char* what;
    shm::Call call;
    uint64_t posts;  // how far the call count moves
  };
  shm::Call bad_magic;
  bad_magic.magic = 1;
  bad_magic.op = static_cast<uint32_t>(shm::Op::kDescribe);
  shm::Call bad_op;
  bad_op.op = 77;
  shm::Call too_long;
  too_long.op = static_cast<uint32_t>(shm::Op::kLookup);
  too_long.request_len = uint64_t{1} << 40;
  shm::Call stray_continue;
  stray_continue.op = static_cast<uint32_t>(shm::Op::kContinue);
  shm::Call good;
  good.op = static_cast<uint32_t>(shm::Op::kDescribe);
  for (const Case& c :
       {Case{"bad magic", bad_magic, 1}, Case{"unknown op", bad_op, 1},
        Case{"request past the area", too_long, 1},
        Case{"a stray continuation", stray_continue, 1},
        Case{"two calls at once", good, 2}}) {
    SCOPED_TRACE(c.what);
    uint8_t* area = nullptr;
    const int fd = RawConnect(&area);
    auto* control = reinterpret_cast<shm::Control*>(area);
    control->call = c.call;
    control->calls_posted.fetch_add(c.posts);
    ASSERT_TRUE(shm::Ring(fd).ok());
    // The store closes the connection without an answer.
    std::atomic<uint32_t> spinning{0};
    EXPECT_EQ(shm::Await(fd, control->replies_posted, 0, spinning,
                         absl::ZeroDuration(), absl::Now() + absl::Seconds(5))
                  .code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(control->replies_posted.load(), 0u);
    close(fd);
  }
  // A request that does not parse is an error answer; the connection stays.
  uint8_t* area = nullptr;
  const int fd = RawConnect(&area);
  auto* control = reinterpret_cast<shm::Control*>(area);
  std::memset(area + shm::kControlBytes, 0xFF, 64);
  shm::Call garbage;
  garbage.op = static_cast<uint32_t>(shm::Op::kLookup);
  garbage.seq = 7;
  garbage.request_len = 64;
  ASSERT_TRUE(shm::Post(fd, control->call, control->calls_posted,
                        control->store_blocked, garbage)
                  .ok());
  ASSERT_TRUE(shm::Await(fd, control->replies_posted, 0,
                         control->client_blocked, absl::ZeroDuration(),
                         absl::Now() + absl::Seconds(5))
                  .ok());
  const shm::Reply reply = control->reply;
  EXPECT_EQ(reply.seq, 7u);
  EXPECT_EQ(reply.code,
            static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  close(fd);
  // And the store serves a proper client as before.
  std::unique_ptr<ShmEngramClient> client = Client();
  EXPECT_TRUE(client->Lookup(TokenRequest(2, v1::ROW_ENCODING_BF16)).ok());
}

TEST_F(ShmEngramClientTest, RejectsBadOptions) {
  ShmEngramClientOptions options;
  EXPECT_EQ(ShmEngramClient::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.socket_path = std::string(200, 'x');
  EXPECT_EQ(ShmEngramClient::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.socket_path = "/tmp/x.sock";
  options.max_attempts = 0;
  EXPECT_EQ(ShmEngramClient::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShmServerOptions server_options;
  EXPECT_EQ(
      ShmEngramServer::Create(server_options, handler_.get(), &gate_, nullptr)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  server_options.socket_path = "/tmp/y.sock";
  server_options.response_bytes = 10;
  EXPECT_EQ(
      ShmEngramServer::Create(server_options, handler_.get(), &gate_, nullptr)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::engram
