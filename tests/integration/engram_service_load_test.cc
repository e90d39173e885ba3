// Starts the real mneme_engram_store daemon on 127.0.0.1:0 over synthetic
// checkpoints and checks it under load: 64 concurrent client streams without
// errors, resident memory and the RAM cache within their budgets, readiness
// (sd_notify) only once the tables open, and SIGTERM during load completing
// the calls in flight. Rows, bad requests and TLS are in
// engram_service_test.cc.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/integration/engram_service_test_util.h"
#include "tests/testing/daemon.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/subprocess.h"

namespace mneme::engram {
namespace {

using ::mneme::testing::Daemon;
using ::mneme::testing::Subprocess;
using service_testing::Checkpoint;
using service_testing::LoadResult;
using service_testing::RunLoad;
using service_testing::StartDaemon;

TEST(EngramServiceLoad, SixtyFourConcurrentStreamsWithoutErrors) {
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  Daemon d = StartDaemon(dir);
  ASSERT_FALSE(d.address.empty());
  std::atomic<bool> stop = false;
  std::atomic<int64_t> calls = 0;
  LoadResult result;
  std::thread load([&] {
    RunLoad(d.address, 64, (*ckpt)->tables()[0].layer,
            (*ckpt)->hasher().vocabulary().num_tokens(), stop, result, calls);
  });
  absl::SleepFor(absl::Seconds(2));
  stop = true;
  load.join();
  absl::MutexLock lock(&result.mu);
  EXPECT_EQ(result.codes.size(), 1u);
  EXPECT_GT(result.codes[absl::StatusCode::kOk], 0);
  d.process->Signal(SIGTERM);
  absl::StatusOr<int> code = d.process->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// Resident memory of a process, from /proc/PID/status (VmRSS), in bytes.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      int64_t kib = 0;
      std::sscanf(line.c_str(), "VmRSS: %ld", &kib);
      return kib * 1024;
    }
  }
  return -1;
}

// The value of an unlabelled series in Prometheus text.
double MetricValue(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + " ")) {
      double value = -1;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(name.size() + 1), &value));
      return value;
    }
  }
  ADD_FAILURE() << "no series " << name;
  return -1;
}

TEST(EngramServiceLoad, MemoryStaysWithinBudgetUnderLoad) {
  const std::string& dir = Checkpoint(formats::RowFormat::kNvfp4);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  Daemon d = StartDaemon(dir, {"--metrics_listen=127.0.0.1:0"});
  ASSERT_FALSE(d.address.empty());
  absl::StatusOr<std::string> line =
      d.process->WaitForStdoutLine("metrics on ", absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  int metrics_port = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(line->substr(line->rfind(':') + 1), &metrics_port));
  const int64_t rss_before = ResidentBytes(d.process->pid());
  std::atomic<bool> stop = false;
  std::atomic<int64_t> calls = 0;
  LoadResult result;
  std::thread load([&] {
    RunLoad(d.address, 64, (*ckpt)->tables()[0].layer,
            (*ckpt)->hasher().vocabulary().num_tokens(), stop, result, calls);
  });
  httplib::Client http("127.0.0.1", metrics_port);
  http.set_read_timeout(10, 0);
  int64_t rss_peak = rss_before;
  for (int i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    rss_peak = std::max(rss_peak, ResidentBytes(d.process->pid()));
    httplib::Result scrape = http.Get("/metrics");
    ASSERT_TRUE(scrape);
    // The RAM cache never holds more than its 8 MiB budget.
    EXPECT_LE(MetricValue(scrape->body, "mneme_engram_ram_cache_bytes"),
              MetricValue(scrape->body, "mneme_engram_ram_cache_budget_bytes"));
  }
  stop = true;
  load.join();
  EXPECT_GT(calls.load(), 0);
  // Everything the daemon allocates per request is bounded (work queue, row
  // limits, stream message size, cache budget): 64 streams may add thread
  // and buffer memory, not growth with traffic.
  EXPECT_LT(rss_peak - rss_before, int64_t{256} << 20)
      << "RSS " << rss_before << " -> " << rss_peak;
  d.process->Signal(SIGTERM);
  absl::StatusOr<int> code = d.process->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

TEST(EngramServiceReadiness, ReadyOnlyAfterTheTablesOpen) {
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  {
    mneme::testing::NotifySocket notify;
    ASSERT_TRUE(notify.bound());
    std::vector<std::string> argv = {
        mneme::testing::RunfilePath("mneme/services/engram/mneme_engram_store"),
        "--checkpoint=" + dir, "--listen=127.0.0.1:0", "--metrics_listen=none"};
    auto p = Subprocess::Start(argv, {{"NOTIFY_SOCKET", notify.env_value()},
                                      {"WATCHDOG_USEC", "200000"}});
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(notify.WaitFor("READY=1", absl::Seconds(60)));
    EXPECT_TRUE(
        (*p)->WaitForStdoutLine("listening on ", absl::Seconds(10)).ok());
    EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", absl::Seconds(10)));
    (*p)->Signal(SIGTERM);
    EXPECT_TRUE(notify.WaitFor("STOPPING=1", absl::Seconds(10)));
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }
  {
    // A checkpoint that does not open: one error line, never READY=1.
    mneme::testing::NotifySocket notify;
    std::vector<std::string> argv = {
        mneme::testing::RunfilePath("mneme/services/engram/mneme_engram_store"),
        "--checkpoint=/nonexistent/ckpt", "--listen=127.0.0.1:0",
        "--metrics_listen=none"};
    auto p = Subprocess::Start(argv, {{"NOTIFY_SOCKET", notify.env_value()}});
    ASSERT_TRUE(p.ok());
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 1);
    EXPECT_FALSE(notify.WaitFor("READY=1", absl::Milliseconds(300)));
    EXPECT_NE((*p)->Stderr().find("/nonexistent/ckpt"), std::string::npos)
        << (*p)->Stderr();
  }
}

TEST(EngramServiceDrain, SigtermDuringLoadCompletesInFlightAndExitsZero) {
  constexpr int kDrainThreads = 16;
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  Daemon d = StartDaemon(dir);
  ASSERT_FALSE(d.address.empty());
  std::atomic<bool> stop = false;
  std::atomic<int64_t> calls = 0;
  LoadResult result;
  std::thread load([&] {
    RunLoad(d.address, kDrainThreads, (*ckpt)->tables()[0].layer,
            (*ckpt)->hasher().vocabulary().num_tokens(), stop, result, calls);
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (calls.load() < 200 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  result.signalled = true;
  d.process->Signal(SIGTERM);
  absl::StatusOr<int> code = d.process->Wait(absl::Seconds(60));
  stop = true;
  load.join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  // Nothing admitted was cut off: the daemon drained within its deadline
  // (it logs when it has to cancel admitted calls).
  ASSERT_NE(d.process->Stderr().find("in-flight RPCs"), std::string::npos)
      << d.process->Stderr();
  EXPECT_EQ(d.process->Stderr().find("drain deadline passed"),
            std::string::npos)
      << d.process->Stderr();
  // Every call started before the signal completed or was refused as
  // draining. A client thread can read `signalled` as false and still send
  // its call only after the daemon stopped listening (two cores, sixteen
  // threads); gRPC cancels such a call without it reaching a handler, so at
  // most one Cancelled per thread is that race, not a lost call.
  absl::MutexLock lock(&result.mu);
  for (const auto& [c, n] : result.before_signal) {
    if (c == absl::StatusCode::kCancelled) {
      EXPECT_LE(n, kDrainThreads) << "CANCELLED x " << n;
      continue;
    }
    EXPECT_TRUE(c == absl::StatusCode::kOk ||
                c == absl::StatusCode::kUnavailable)
        << absl::StatusCodeToString(c) << " x " << n;
  }
  // Later calls are refused: Unavailable while draining or once the server
  // is gone, or Cancelled by gRPC for calls that reach the server while it
  // shuts down after the drain (never admitted).
  for (const auto& [c, n] : result.codes) {
    if (c == absl::StatusCode::kCancelled) continue;
    EXPECT_TRUE(c == absl::StatusCode::kOk ||
                c == absl::StatusCode::kUnavailable)
        << absl::StatusCodeToString(c) << " x " << n;
  }
  EXPECT_GT(result.codes[absl::StatusCode::kOk], 0);
}

}  // namespace
}  // namespace mneme::engram
