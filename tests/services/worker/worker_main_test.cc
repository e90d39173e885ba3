// The mneme_worker daemon as a process: bad startup input exits 1 with one
// clear line before it serves (or makes peers wait); a good start announces
// READY to systemd only once the shard is loaded, feeds the watchdog, and
// stops cleanly on SIGTERM.

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/daemon.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/subprocess.h"

namespace mneme {
namespace {

using ::mneme::testing::RunfilePath;
using ::mneme::testing::Subprocess;
using ::testing::HasSubstr;

const std::string& Checkpoint() {
  static const std::string* dir = [] {
    auto* d = new std::string(absl::StrCat(getenv("TEST_TMPDIR"), "/tiny"));
    const testing::CommandResult r =
        testing::RunMneme({"make-checkpoint", "--model", "--out", *d});
    EXPECT_EQ(r.code, 0) << r.err;
    return d;
  }();
  return *dir;
}

std::string Worker() {
  return RunfilePath("mneme/services/worker/mneme_worker");
}

std::vector<std::string> BaseArgs() {
  return {Worker(), "--listen=127.0.0.1:0", "--metrics_listen=none",
          "--threads=1"};
}

testing::Daemon StartStore(const std::string& checkpoint) {
  return testing::StartDaemon(
      {RunfilePath("mneme/services/engram/mneme_engram_store"),
       "--checkpoint=" + checkpoint, "--listen=127.0.0.1:0",
       "--metrics_listen=none", "--io_threads=1", "--worker_threads=1"});
}

struct BadCase {
  std::vector<std::string> flags;
  std::string message;
};

TEST(WorkerMainTest, BadStartupInputExitsOneWithOneLine) {
  const std::string ckpt = "--checkpoint=" + Checkpoint();
  const std::vector<BadCase> cases = {
      {{}, "--checkpoint is required"},
      {{ckpt, "--tp_size=0"}, "--tp_size=0"},
      {{ckpt, "--tp_size=2", "--rank=2"}, "--rank=2"},
      {{ckpt, "--tp_size=2", "--rank=1"}, "--group=HOST:PORT"},
      {{ckpt, "--tp_size=2", "--rank=1", "--group=nope"}, "--group"},
      {{ckpt, "--backend=tpu"}, "--backend=tpu"},
      {{ckpt, "--backend=cuda", "--device=-1"}, "--device=-1"},
      // No such device, whatever this build and machine have: "this build
      // has no CUDA backend", "no usable CUDA device" or "CUDA device 99 is
      // not there".
      {{ckpt, "--backend=cuda", "--device=99", "--engram_store=127.0.0.1:1"},
       "CUDA"},
      {{ckpt, "--kv_cache_bytes=0"}, "--kv_cache_bytes"},
      {{ckpt, "--engram_store=127.0.0.1:x"}, "--engram_store"},
      // The model is checked before the group is joined.
      {{ckpt, "--tp_size=3"}, "does not divide the 8 attention heads"},
      {{ckpt}, "engram store address is required"},
      {{"--checkpoint=/nonexistent/ckpt", "--engram_store=127.0.0.1:1"},
       "/nonexistent/ckpt"},
      {{ckpt, "--engram_store=127.0.0.1:1", "--bogus_flag=1"}, "bogus_flag"},
  };
  for (const BadCase& c : cases) {
    std::vector<std::string> argv = BaseArgs();
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const testing::CommandResult r =
        testing::RunCommand(argv, absl::Seconds(60));
    EXPECT_EQ(r.code, 1) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(testing::NonEmptyLines(r.err).size(), 1u) << r.err;
  }
}

TEST(WorkerMainTest, ConfigThatDoesNotMatchTheTensorsFailsAtLoad) {
  namespace fs = std::filesystem;
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/mismatch");
  fs::copy(Checkpoint(), dir, fs::copy_options::recursive);
  // One expert fewer than the checkpoint holds: gate.weight's rows differ.
  const testing::CommandResult sed = testing::RunCommand(
      {"/bin/sed", "-i", "s/\"n_routed_experts\": 16/\"n_routed_experts\": 8/",
       dir + "/config.json"});
  ASSERT_EQ(sed.code, 0);
  // An engram store for the tables.
  const testing::Daemon store = StartStore(dir);
  const std::string address = store.address;
  std::vector<std::string> argv = BaseArgs();
  argv.push_back("--checkpoint=" + dir);
  argv.push_back("--engram_store=" + address);
  const testing::CommandResult r = testing::RunCommand(argv, absl::Seconds(60));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("layers.0.ffn.gate.weight"));
  EXPECT_THAT(r.err, HasSubstr("the config implies [8, 256]"));
}

TEST(WorkerMainTest, ReadyAfterLoadWatchdogAndStopping) {
  const testing::Daemon store = StartStore(Checkpoint());
  const std::string address = store.address;

  testing::NotifySocket notify;
  ASSERT_TRUE(notify.bound());
  std::vector<std::string> argv = BaseArgs();
  argv.push_back("--checkpoint=" + Checkpoint());
  argv.push_back("--engram_store=" + address);
  absl::StatusOr<std::unique_ptr<Subprocess>> worker = Subprocess::Start(
      argv,
      {{"NOTIFY_SOCKET", notify.env_value()}, {"WATCHDOG_USEC", "200000"}});
  ASSERT_TRUE(worker.ok());
  EXPECT_TRUE(notify.WaitFor("READY=1", absl::Seconds(60)))
      << (*worker)->Stderr();
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", absl::Seconds(10)));
  (*worker)->Signal(SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", absl::Seconds(10)));
  absl::StatusOr<int> code = (*worker)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << (*worker)->Stderr();
}

}  // namespace
}  // namespace mneme

namespace mneme {
namespace {

TEST(WorkerMainTest, CheckConfigValidatesWithoutStarting) {
  for (const char* spelling : {"--check_config", "--check-config"}) {
    std::vector<std::string> argv = BaseArgs();
    argv.insert(argv.end(), {"--checkpoint=/does/not/need/to/exist",
                             "--tp_size=4", "--rank=2", "--group=10.0.0.1:1",
                             "--engram_store=127.0.0.1:1", spelling});
    const testing::CommandResult r = testing::RunCommand(argv);
    EXPECT_EQ(r.code, 0) << spelling << ": " << r.err;
    EXPECT_EQ(r.out, "mneme_worker: config ok\n");
  }
  std::vector<std::string> bad = BaseArgs();
  bad.insert(bad.end(),
             {"--checkpoint=/x", "--tp_size=4", "--rank=2", "--check-config"});
  const testing::CommandResult r = testing::RunCommand(bad);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--group"));
}

}  // namespace
}  // namespace mneme

namespace mneme {
namespace {

TEST(WorkerMainTest, MetricsCountStepsTokensAndBlocks) {
  const testing::Daemon store = StartStore(Checkpoint());
  std::vector<std::string> argv = {Worker(),
                                   "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0",
                                   "--threads=1",
                                   "--checkpoint=" + Checkpoint(),
                                   "--engram_store=" + store.address};
  testing::Daemon worker = testing::StartDaemon(argv);
  const std::string metrics =
      testing::StdoutValue(*worker.process, "metrics on ");
  auto stub = worker::v1::Worker::NewStub(
      grpc::CreateChannel(worker.address, grpc::InsecureChannelCredentials()));
  worker::v1::StepRequest step;
  worker::v1::SequenceChunk* c = step.add_chunks();
  c->set_sequence_id(7);
  for (int64_t t : {5, 6, 7}) c->add_token_ids(t);
  c->set_output(worker::v1::OUTPUT_SAMPLE);
  worker::v1::StepResponse response;
  grpc::Status st;
  // Until it is ready: loading takes longer on a busy machine.
  const absl::Time ready_by = absl::Now() + absl::Seconds(120);
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    st = stub->Step(&ctx, step, &response);
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < ready_by);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const size_t colon = metrics.rfind(':');
  httplib::Client http(metrics.substr(0, colon),
                       std::stoi(metrics.substr(colon + 1)));
  httplib::Result r = http.Get("/metrics");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_THAT(r->body, HasSubstr("mneme_worker_steps_total{outcome=\"ok\"} 1"));
  EXPECT_THAT(r->body, HasSubstr("mneme_worker_tokens_total 3"));
  EXPECT_THAT(r->body, HasSubstr("mneme_worker_sequences 1"));
  EXPECT_THAT(r->body,
              ::testing::Not(HasSubstr("mneme_worker_kv_blocks_used 0\n")));
}

}  // namespace
}  // namespace mneme
