// LocalCluster with stand-in daemons (shell scripts that print their
// address and sleep) and an in-process gRPC health server playing the
// coordinator's health endpoint: option validation, start order and flags,
// startup failures, and the supervision (a lost daemon, worker, store or
// coordinator, is restarted alone on the same ports).

#include "tools/cluster/local_cluster.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace mneme::cluster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A store or worker: echoes its flags, prints its address (a made-up port
// for --listen=...:0, else the one given) and sleeps. FAIL_IF=<flag> makes
// the run with that flag exit 2 at once.
constexpr char kFakeDaemon[] = R"sh(#!/bin/sh
echo "args: $*"
listen=""
for a in "$@"; do
  case "$a" in --listen=*) listen="${a#--listen=}" ;; esac
  if [ -n "$FAIL_IF" ] && [ "$a" = "$FAIL_IF" ]; then
    echo "failing on $a" >&2
    exit 2
  fi
done
port=$(( $$ % 50000 + 10000 ))
case "$listen" in *:0) listen="127.0.0.1:$port" ;; esac
echo "listening on $listen"
exec sleep 1000
)sh";

// The coordinator's health endpoint: SERVING unless told otherwise.
class FakeHealth : public ::grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(
      grpc::ServerContext*, const ::grpc::health::v1::HealthCheckRequest*,
      ::grpc::health::v1::HealthCheckResponse* response) override {
    response->set_status(
        serving_.load() ? ::grpc::health::v1::HealthCheckResponse::SERVING
                        : ::grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }
  void set_serving(bool serving) { serving_.store(serving); }

 private:
  std::atomic<bool> serving_{true};
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

std::string WriteScript(const std::string& dir, const std::string& name,
                        const std::string& text) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  chmod(path.c_str(), 0755);
  return path;
}

// "args: ..." lines of a fake daemon's log, one per run.
std::vector<std::string> Runs(const std::string& log) {
  std::vector<std::string> runs;
  for (absl::string_view line : absl::StrSplit(ReadFile(log), '\n')) {
    if (absl::StartsWith(line, "args: ")) runs.emplace_back(line);
  }
  return runs;
}

// Runs(log) once it has `n` runs (a restarted daemon starts writing a little
// after its start was reported).
std::vector<std::string> WaitForRuns(const std::string& log, size_t n) {
  while (true) {
    std::vector<std::string> runs = Runs(log);
    if (runs.size() >= n) return runs;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

bool Gone(pid_t pid) { return kill(pid, 0) == -1 && errno == ESRCH; }

class LocalClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&health_);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    health_server_ = builder.BuildAndStart();
    ASSERT_NE(health_server_, nullptr);
    health_address_ = absl::StrCat("127.0.0.1:", port);

    dir_ = mneme::testing::MakeTempDir("cluster");
    const std::string daemon = WriteScript(dir_, "fake_daemon", kFakeDaemon);
    const std::string coordinator = WriteScript(
        dir_, "fake_coordinator",
        absl::StrCat("#!/bin/sh\necho \"args: $*\"\n",
                     "echo 'metrics on 127.0.0.1:9'\n", "echo 'listening on ",
                     health_address_, "'\necho 'http on 127.0.0.1:8'\n",
                     "exec sleep 1000\n"));
    options_.binaries = {daemon, daemon, coordinator};
    options_.checkpoint_dir = "/the/checkpoint";
    options_.workdir = dir_;
    options_.tp_size = 2;
    options_.ready_timeout = absl::Seconds(60);
    options_.restart_interval = absl::ZeroDuration();
    options_.poll_interval = absl::Milliseconds(10);
    options_.on_event = [this](absl::string_view line) {
      events_.emplace_back(line);
      if (cancel_on_ && cancel_on_(line)) cluster_->Cancel();
    };
  }

  void TearDown() override {
    cluster_.reset();
    unsetenv("FAIL_IF");
    health_server_->Shutdown();
  }

  absl::Status Start() {
    absl::StatusOr<std::unique_ptr<LocalCluster>> c =
        LocalCluster::Create(options_);
    if (!c.ok()) return c.status();
    cluster_ = *std::move(c);
    return cluster_->Start();
  }

  std::map<std::string, LocalCluster::DaemonInfo> Daemons() const {
    std::map<std::string, LocalCluster::DaemonInfo> out;
    for (const LocalCluster::DaemonInfo& d : cluster_->daemons()) {
      out[d.name] = d;
    }
    return out;
  }

  FakeHealth health_;
  std::unique_ptr<grpc::Server> health_server_;
  std::string health_address_;
  std::string dir_;
  LocalClusterOptions options_;
  std::unique_ptr<LocalCluster> cluster_;
  std::vector<std::string> events_;
  // When set, an event line it accepts cancels the cluster.
  std::function<bool(absl::string_view)> cancel_on_;
};

TEST_F(LocalClusterTest, RejectsBadOptions) {
  auto code_and_message = [](const LocalClusterOptions& o) {
    absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Create(o);
    return std::make_pair(c.status().code(), std::string(c.status().message()));
  };
  LocalClusterOptions o = options_;
  o.tp_size = 0;
  EXPECT_EQ(code_and_message(o),
            std::make_pair(absl::StatusCode::kInvalidArgument,
                           std::string("LocalClusterOptions.tp_size=0 must be "
                                       "in [1, 64]")));
  o = options_;
  o.dcp_size = 3;
  EXPECT_EQ(code_and_message(o).first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(code_and_message(o).second, HasSubstr("dcp_size=3"));
  o = options_;
  o.checkpoint_dir.clear();
  EXPECT_THAT(code_and_message(o).second, HasSubstr("checkpoint_dir"));
  o = options_;
  o.binaries.worker.clear();
  EXPECT_THAT(code_and_message(o).second, HasSubstr("binaries.worker"));
  o = options_;
  o.threads_per_worker = 0;
  EXPECT_THAT(code_and_message(o).second, HasSubstr("threads_per_worker"));
  o = options_;
  o.backend = "tpu";
  EXPECT_THAT(code_and_message(o).second, HasSubstr("backend"));
  o = options_;
  o.comm_timeout = absl::ZeroDuration();
  EXPECT_THAT(code_and_message(o).second, HasSubstr("comm_timeout"));
  o = options_;
  o.coordinator_listen = "no-port";
  EXPECT_EQ(code_and_message(o).first, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(code_and_message(o).second, HasSubstr("coordinator_listen"));
  o = options_;
  o.workdir = dir_ + "/missing";
  EXPECT_EQ(code_and_message(o).first, absl::StatusCode::kNotFound);
  o = options_;
  o.dcp_size = 2;
  EXPECT_TRUE(LocalCluster::Create(o).ok());
}

TEST_F(LocalClusterTest, StartsInOrderWithTheRightFlags) {
  options_.dcp_size = 2;
  options_.max_num_batched_tokens = 64;
  options_.max_num_seqs = 8;
  options_.kv_cache_bytes = 1 << 20;
  options_.threads_per_worker = 3;
  options_.comm_timeout = absl::Seconds(5);
  ASSERT_TRUE(Start().ok());
  std::map<std::string, LocalCluster::DaemonInfo> d = Daemons();
  ASSERT_EQ(d.size(), 4u);
  const std::string store = d["engram_store"].address;
  const std::string w0 = d["worker 0"].address;
  const std::string w1 = d["worker 1"].address;
  EXPECT_EQ(cluster_->coordinator_address(), health_address_);
  EXPECT_EQ(cluster_->coordinator_metrics_address(), "127.0.0.1:9");
  EXPECT_THAT(
      events_,
      ElementsAre(absl::StrCat("engram_store pid ", d["engram_store"].pid,
                               " at ", store),
                  absl::StrCat("worker 0 pid ", d["worker 0"].pid, " at ", w0),
                  absl::StrCat("worker 1 pid ", d["worker 1"].pid, " at ", w1),
                  absl::StrCat("coordinator pid ", d["coordinator"].pid, " at ",
                               health_address_, " (metrics on 127.0.0.1:9)")));

  EXPECT_EQ(d["engram_store"].log_path, dir_ + "/engram_store.log");
  EXPECT_THAT(Runs(dir_ + "/engram_store.log"),
              ElementsAre(AllOf(HasSubstr("--checkpoint=/the/checkpoint"),
                                HasSubstr("--listen=127.0.0.1:0"),
                                HasSubstr("--metrics_listen=none"))));
  const std::vector<std::string> rank1 = Runs(dir_ + "/worker1.log");
  ASSERT_EQ(rank1.size(), 1u);
  for (const std::string& flag :
       {std::string("--checkpoint=/the/checkpoint"), std::string("--rank=1"),
        std::string("--tp_size=2"), std::string("--dcp_size=2"),
        "--engram_store=" + store, std::string("--threads=3"),
        std::string("--kv_cache_bytes=1048576"),
        std::string("--comm_timeout=5s"), "--group=" + w0,
        std::string("--backend=cpu"), std::string("--metrics_listen=none"),
        std::string("--listen=127.0.0.1:0")}) {
    EXPECT_THAT(rank1[0], HasSubstr(flag));
  }
  EXPECT_THAT(Runs(dir_ + "/worker0.log"),
              ElementsAre(AllOf(HasSubstr("--rank=0"),
                                ::testing::Not(HasSubstr("--group=")))));
  EXPECT_THAT(Runs(dir_ + "/coordinator.log"),
              ElementsAre(AllOf(HasSubstr("--workers=" + w0 + "," + w1),
                                HasSubstr("--max_num_batched_tokens=64"),
                                HasSubstr("--max_num_seqs=8"),
                                HasSubstr("--listen=127.0.0.1:0"),
                                HasSubstr("--metrics_listen=127.0.0.1:0"))));

  // Every daemon gets the cluster secret written to the workdir: 32 random
  // bytes in hex, readable by the owner only.
  const std::string secret_flag =
      absl::StrCat("--cluster_secret_file=", dir_, "/cluster_secret");
  for (const char* log :
       {"engram_store.log", "worker0.log", "worker1.log", "coordinator.log"}) {
    EXPECT_THAT(Runs(absl::StrCat(dir_, "/", log)),
                ElementsAre(HasSubstr(secret_flag)))
        << log;
  }
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/cluster_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  std::ifstream secret_file(dir_ + "/cluster_secret");
  std::string secret;
  std::getline(secret_file, secret);
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(secret, std::string(64, '0'));

  cluster_->Stop();
  for (const auto& [name, info] : d) EXPECT_TRUE(Gone(info.pid)) << name;
  cluster_->Stop();  // Idempotent.
}

// A checkpoint whose config has no Engram layers (V4-Flash) runs without an
// engram store, and its workers get no --engram_store.
TEST_F(LocalClusterTest, NoEngramLayersNoStore) {
  const std::string ckpt = dir_ + "/v4-checkpoint";
  std::filesystem::create_directories(ckpt);
  std::ofstream(ckpt + "/config.json")
      << R"({"model_type": "deepseek_v4", "hidden_size": 256})";
  options_.checkpoint_dir = ckpt;
  ASSERT_TRUE(Start().ok());
  std::map<std::string, LocalCluster::DaemonInfo> d = Daemons();
  EXPECT_EQ(d.count("engram_store"), 0u);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_THAT(Runs(dir_ + "/worker1.log"),
              ElementsAre(::testing::Not(HasSubstr("--engram_store"))));
  cluster_->Stop();
}

TEST_F(LocalClusterTest, AKilledWorkerIsRestartedAloneOnItsPorts) {
  ASSERT_TRUE(Start().ok());
  std::map<std::string, LocalCluster::DaemonInfo> before = Daemons();
  const std::string killed_line =
      absl::StrCat("worker 1 pid ", before["worker 1"].pid, " ");
  cancel_on_ = [&](absl::string_view line) {
    return absl::StartsWith(line, "worker 1 pid ") &&
           !absl::StartsWith(line, killed_line);
  };
  ASSERT_EQ(kill(before["worker 1"].pid, SIGKILL), 0);
  ASSERT_TRUE(cluster_->Run().ok());

  std::map<std::string, LocalCluster::DaemonInfo> after = Daemons();
  EXPECT_NE(after["worker 1"].pid, before["worker 1"].pid);
  EXPECT_EQ(after["worker 1"].address, before["worker 1"].address);
  // The other rank keeps running (and its weights): the coordinator re-forms
  // the group with the restarted rank.
  EXPECT_EQ(after["worker 0"].pid, before["worker 0"].pid);
  EXPECT_FALSE(Gone(before["worker 0"].pid));
  EXPECT_EQ(after["engram_store"].pid, before["engram_store"].pid);
  EXPECT_EQ(after["coordinator"].pid, before["coordinator"].pid);
  const std::vector<std::string> tail(events_.begin() + 4, events_.end());
  EXPECT_THAT(
      tail,
      ElementsAre(
          absl::StrCat(killed_line, "was killed by signal 9 (SIGKILL)"),
          absl::StrCat("restarting worker 1 on ", before["worker 1"].address),
          absl::StrCat("worker 1 pid ", after["worker 1"].pid, " at ",
                       after["worker 1"].address)));
  // Same flags, now with the ports the first run bound.
  const std::vector<std::string> runs = WaitForRuns(dir_ + "/worker1.log", 2);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_THAT(runs[1], HasSubstr("--listen=" + before["worker 1"].address));
  EXPECT_THAT(runs[1], HasSubstr("--group=" + before["worker 0"].address));
  EXPECT_EQ(Runs(dir_ + "/worker0.log").size(), 1u);
  cluster_->Stop();
  for (const auto& [name, info] : after) EXPECT_TRUE(Gone(info.pid)) << name;
}

TEST_F(LocalClusterTest, AKilledStoreIsRestartedAlone) {
  ASSERT_TRUE(Start().ok());
  std::map<std::string, LocalCluster::DaemonInfo> before = Daemons();
  const std::string old_line =
      absl::StrCat("engram_store pid ", before["engram_store"].pid, " ");
  cancel_on_ = [&](absl::string_view line) {
    return absl::StartsWith(line, "engram_store pid ") &&
           !absl::StartsWith(line, old_line);
  };
  ASSERT_EQ(kill(before["engram_store"].pid, SIGKILL), 0);
  ASSERT_TRUE(cluster_->Run().ok());
  std::map<std::string, LocalCluster::DaemonInfo> after = Daemons();
  EXPECT_NE(after["engram_store"].pid, before["engram_store"].pid);
  EXPECT_EQ(after["engram_store"].address, before["engram_store"].address);
  // The workers ride it out with their weights.
  EXPECT_EQ(after["worker 0"].pid, before["worker 0"].pid);
  EXPECT_EQ(after["worker 1"].pid, before["worker 1"].pid);
  EXPECT_THAT(events_, ::testing::Contains(
                           absl::StrCat("restarting engram_store on ",
                                        before["engram_store"].address)));
  EXPECT_THAT(WaitForRuns(dir_ + "/engram_store.log", 2)[1],
              HasSubstr("--listen=" + before["engram_store"].address));
}

TEST_F(LocalClusterTest, AKilledCoordinatorIsRestartedAlone) {
  ASSERT_TRUE(Start().ok());
  std::map<std::string, LocalCluster::DaemonInfo> before = Daemons();
  const std::string old_line =
      absl::StrCat("coordinator pid ", before["coordinator"].pid, " ");
  cancel_on_ = [&](absl::string_view line) {
    return absl::StartsWith(line, "coordinator pid ") &&
           !absl::StartsWith(line, old_line);
  };
  ASSERT_EQ(kill(before["coordinator"].pid, SIGKILL), 0);
  ASSERT_TRUE(cluster_->Run().ok());
  std::map<std::string, LocalCluster::DaemonInfo> after = Daemons();
  EXPECT_NE(after["coordinator"].pid, before["coordinator"].pid);
  EXPECT_EQ(after["worker 0"].pid, before["worker 0"].pid);
  EXPECT_EQ(after["engram_store"].pid, before["engram_store"].pid);
  EXPECT_THAT(WaitForRuns(dir_ + "/coordinator.log", 2)[1],
              AllOf(HasSubstr("--listen=" + health_address_),
                    HasSubstr("--metrics_listen=127.0.0.1:9")));
}

TEST_F(LocalClusterTest, AWorkerThatExitsAtStartupIsUnavailable) {
  setenv("FAIL_IF", "--rank=1", 1);
  const absl::Status st = Start();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(st.message()), StartsWith("worker 1 (pid "));
  EXPECT_THAT(st.message(), HasSubstr("exited with status 2"));
  EXPECT_THAT(st.message(), HasSubstr(dir_ + "/worker1.log"));
  EXPECT_THAT(st.message(), HasSubstr("failing on --rank=1"));
  // What had started was stopped.
  for (const LocalCluster::DaemonInfo& d : cluster_->daemons()) {
    EXPECT_TRUE(Gone(d.pid)) << d.name;
  }
}

TEST_F(LocalClusterTest, NotServingUntilTheDeadlineIsDeadlineExceeded) {
  health_.set_serving(false);
  options_.ready_timeout = absl::Milliseconds(500);
  const absl::Status st = Start();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(), HasSubstr("NOT_SERVING"));
  EXPECT_THAT(st.message(), HasSubstr(dir_ + "/coordinator.log"));
  for (const LocalCluster::DaemonInfo& d : cluster_->daemons()) {
    EXPECT_TRUE(Gone(d.pid)) << d.name;
  }
}

TEST_F(LocalClusterTest, AMissingBinaryIsNamed) {
  options_.binaries.worker = dir_ + "/no_such_worker";
  const absl::Status st = Start();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("worker 0"));
  EXPECT_THAT(st.message(), HasSubstr(dir_ + "/no_such_worker"));
}

TEST_F(LocalClusterTest, CallOrder) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> c =
      LocalCluster::Create(options_);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Run().code(), absl::StatusCode::kFailedPrecondition);
  (*c)->Cancel();
  EXPECT_EQ((*c)->Start().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*c)->Start().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*c)->Run().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mneme::cluster
