// GlooCommunicator ranks as separate processes (gloo_peer) meeting through
// a real Rendezvous gRPC server on 127.0.0.1:0 in this test, and a peer
// that is killed while the survivor (this process) still uses the group.
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/inflight_gate.h"
#include "gmock/gmock.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/grpc_rendezvous_store.h"
#include "gpu/comm/rendezvous_service.h"
#include "gtest/gtest.h"
#include "services/common/server_runner.h"
#include "tests/gpu/comm/collective_checks.h"
#include "tests/testing/subprocess.h"

namespace mneme::gpu {
namespace {

using ::mneme::testing::Subprocess;
using ::testing::AnyOf;

class GlooProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto service = RendezvousService::Create({}, &gate_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    auto runner =
        ServerRunner::Create(ServerOptions(), {service_.get()}, &gate_);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  std::unique_ptr<Subprocess> StartPeer(const std::string& prefix, int rank,
                                        int size, const std::string& mode,
                                        absl::Duration timeout) {
    auto peer = Subprocess::Start({
        mneme::testing::RunfilePath("mneme/tests/gpu/comm/gloo_peer"),
        "--target=" + runner_->address().ToString(),
        "--prefix=" + prefix,
        absl::StrCat("--rank=", rank),
        absl::StrCat("--size=", size),
        absl::StrCat("--timeout_ms=", absl::ToInt64Milliseconds(timeout)),
        "--mode=" + mode,
    });
    EXPECT_TRUE(peer.ok()) << peer.status();
    return peer.ok() ? *std::move(peer) : nullptr;
  }

  std::unique_ptr<GrpcRendezvousStore> Client(const std::string& prefix) {
    GrpcRendezvousStoreOptions options;
    options.target = runner_->address().ToString();
    options.key_prefix = prefix;
    auto client = GrpcRendezvousStore::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  InflightGate gate_;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<ServerRunner> runner_;
};

class GlooProcessGroupTest : public GlooProcessTest,
                             public ::testing::WithParamInterface<int> {};

TEST_P(GlooProcessGroupTest, EveryCollectiveIsExactAcrossProcesses) {
  const int size = GetParam();
  const std::string prefix = absl::StrCat("group-", size, "/gen-1/");
  std::vector<std::unique_ptr<Subprocess>> peers;
  for (int r = 0; r < size; ++r) {
    peers.push_back(StartPeer(prefix, r, size, "check", absl::Seconds(60)));
    ASSERT_NE(peers.back(), nullptr);
  }
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<int> code = peers[r]->Wait(absl::Seconds(240));
    ASSERT_TRUE(code.ok()) << "rank " << r << ": " << code.status();
    EXPECT_EQ(*code, 0) << "rank " << r << " stdout:\n"
                        << peers[r]->Stdout() << "stderr:\n"
                        << peers[r]->Stderr();
    EXPECT_EQ(peers[r]->Stdout().rfind("PASS", 0), 0u) << peers[r]->Stdout();
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooProcessGroupTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Ranks" + std::to_string(info.param);
                         });

TEST_F(GlooProcessTest, KilledPeerFailsInsteadOfHanging) {
  const std::string prefix = "killed/gen-1/";
  // The timeout bounds the rendezvous too, so it leaves room for the peer
  // to start.
  std::unique_ptr<Subprocess> peer =
      StartPeer(prefix, 1, 2, "hang", absl::Seconds(10));
  ASSERT_NE(peer, nullptr);
  auto store = Client(prefix);
  GlooCommunicatorOptions options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Seconds(10);
  auto comm = GlooCommunicator::Create(options, *store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE((*comm)->Barrier().ok());
  ASSERT_TRUE(peer->WaitForStdoutLine("READY", absl::Seconds(30)).ok())
      << peer->Stderr();
  peer->Signal(SIGKILL);
  absl::StatusOr<int> code = peer->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGKILL);

  // Unavailable once Gloo saw the closed connection; DeadlineExceeded if
  // the send was queued for the peer's receive before it did.
  std::vector<float> data(1 << 16, 1.0f);
  const absl::Status first = (*comm)->AllReduceSum(data.data(), data.size());
  EXPECT_THAT(first.code(), AnyOf(absl::StatusCode::kUnavailable,
                                  absl::StatusCode::kDeadlineExceeded))
      << first;
  EXPECT_EQ((*comm)->AllReduceSum(data.data(), data.size()), first);
  EXPECT_EQ((*comm)->Barrier(), first);
}

TEST_F(GlooProcessTest, PeerKilledMidTransferEndsTheLoop) {
  // Both ranks run 4 MiB all-reduces back to back; rank 1 is killed while
  // they are in flight. Writes into the dead connection must not kill
  // this process (SIGPIPE), and the loop must end with Unavailable - or,
  // when the death catches a send still waiting for the peer's receive
  // (Gloo then learns nothing until its timeout), DeadlineExceeded.
  const std::string prefix = "mid-transfer/gen-1/";
  std::unique_ptr<Subprocess> peer =
      StartPeer(prefix, 1, 2, "loop", absl::Seconds(10));
  ASSERT_NE(peer, nullptr);
  auto store = Client(prefix);
  GlooCommunicatorOptions options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Seconds(10);
  auto comm = GlooCommunicator::Create(options, *store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  struct sigaction sigpipe {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &sigpipe), 0);
  EXPECT_EQ(sigpipe.sa_handler, SIG_IGN);

  std::thread killer([&] {
    EXPECT_TRUE(peer->WaitForStdoutLine("LOOPING", absl::Seconds(60)).ok());
    peer->Signal(SIGKILL);
  });
  std::vector<float> data(1 << 20, 1.0f);
  absl::Status s;
  while (s.ok()) s = (*comm)->AllReduceSum(data.data(), data.size());
  killer.join();
  EXPECT_THAT(s.code(), AnyOf(absl::StatusCode::kUnavailable,
                              absl::StatusCode::kDeadlineExceeded))
      << s;
  EXPECT_GE((*comm)->stats().calls, 1);
}

TEST_F(GlooProcessTest, RejoinedGroupUsesANewGeneration) {
  // A group whose rank 1 died re-forms under a new prefix; the stale
  // addresses of generation 1 are never read.
  {
    std::unique_ptr<Subprocess> peer =
        StartPeer("rejoin/gen-1/", 1, 2, "hang", absl::Seconds(30));
    ASSERT_NE(peer, nullptr);
    auto store = Client("rejoin/gen-1/");
    GlooCommunicatorOptions options;
    options.size = 2;
    options.timeout = absl::Seconds(30);
    auto comm = GlooCommunicator::Create(options, *store);
    ASSERT_TRUE(comm.ok()) << comm.status();
    ASSERT_TRUE((*comm)->Barrier().ok());
    peer->Signal(SIGKILL);
    ASSERT_TRUE(peer->Wait(absl::Seconds(30)).ok());
  }
  std::unique_ptr<Subprocess> peer =
      StartPeer("rejoin/gen-2/", 1, 2, "check", absl::Seconds(60));
  ASSERT_NE(peer, nullptr);
  auto store = Client("rejoin/gen-2/");
  GlooCommunicatorOptions options;
  options.size = 2;
  auto comm = GlooCommunicator::Create(options, *store);
  ASSERT_TRUE(comm.ok()) << comm.status();
  // gloo_peer runs the full check sequence; so does this rank.
  EXPECT_TRUE(testing::RunCollectiveChecks(**comm, {1, 7, 1000, 1 << 20}).ok());
  absl::StatusOr<int> code = peer->Wait(absl::Seconds(240));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << peer->Stdout() << peer->Stderr();
}

}  // namespace
}  // namespace mneme::gpu
