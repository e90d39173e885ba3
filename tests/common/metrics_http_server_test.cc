#include "common/metrics_http_server.h"

#include <glog/logging.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "tests/testing/subprocess.h"

namespace mneme {
namespace {

template <typename T>
T Must(absl::StatusOr<T> result) {
  CHECK(result.ok()) << result.status();
  return *std::move(result);
}

httplib::Result HttpGet(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  return client.Get(path);
}

std::unique_ptr<MetricsHttpServer> MustCreate(
    const MetricsHttpServerOptions& options, const MetricsRegistry* registry,
    MetricsHttpServer::ReadinessCallback ready = [] { return true; }) {
  return Must(MetricsHttpServer::Create(options, registry, std::move(ready)));
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream file(path, std::ios::binary);
  file << contents;
  CHECK(file.good()) << path;
}

TEST(MetricsHttpServerTest, ServesMetricsHealthAndReadiness) {
  MetricsRegistry registry;
  CounterFamily* requests =
      Must(registry.AddCounter({.name = "requests_total",
                                .help = "Requests.",
                                .label_names = {"code"}}));
  Must(requests->Get({"OK"}))->Increment(7);
  std::atomic<bool> ready{false};
  auto server = MustCreate({}, &registry, [&ready] { return ready.load(); });
  ASSERT_GT(server->port(), 0);

  httplib::Result healthz = HttpGet(server->port(), "/healthz");
  ASSERT_TRUE(healthz) << httplib::to_string(healthz.error());
  EXPECT_EQ(healthz->status, 200);
  EXPECT_EQ(healthz->body, "ok");

  httplib::Result readyz = HttpGet(server->port(), "/readyz");
  ASSERT_TRUE(readyz) << httplib::to_string(readyz.error());
  EXPECT_EQ(readyz->status, 503);
  EXPECT_EQ(readyz->body, "not ready");
  ready.store(true);
  readyz = HttpGet(server->port(), "/readyz");
  ASSERT_TRUE(readyz) << httplib::to_string(readyz.error());
  EXPECT_EQ(readyz->status, 200);
  EXPECT_EQ(readyz->body, "ready");

  httplib::Result metrics = HttpGet(server->port(), "/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_TRUE(absl::StartsWith(metrics->get_header_value("Content-Type"),
                               "text/plain; version=0.0.4"))
      << metrics->get_header_value("Content-Type");
  EXPECT_EQ(metrics->body, registry.ExportText());
  EXPECT_TRUE(absl::StrContains(metrics->body, "requests_total{code=\"OK\"} 7"))
      << metrics->body;

  httplib::Result unknown = HttpGet(server->port(), "/nope");
  ASSERT_TRUE(unknown) << httplib::to_string(unknown.error());
  EXPECT_EQ(unknown->status, 404);
}

// The acceptance check: a real scrape parses as Prometheus text with
// prometheus_client and holds exactly the registered families and values.
TEST(MetricsHttpServerTest, ScrapeParsesWithPrometheusClient) {
  MetricsRegistry registry;
  CounterFamily* requests =
      Must(registry.AddCounter({.name = "mneme_test_requests_total",
                                .help = "Requests handled.",
                                .label_names = {"method", "code"}}));
  Must(requests->Get({"Generate", "OK"}))->Increment(3);
  Must(requests->Get({"Generate", "UNAVAILABLE"}))->Increment();
  Must(registry.AddCounter({.name = "mneme_test_restarts"}));
  GaugeFamily* depth = Must(registry.AddGauge({.name = "mneme_test_queue_depth",
                                               .help = "Line one\nback\\slash",
                                               .label_names = {"queue"}}));
  Must(depth->Get({"a\"b\\c\nd"}))->Set(7.5);
  Must(depth->Get({"plain"}))->Set(-2);
  ASSERT_TRUE(registry
                  .AddCallbackGauge(
                      {.name = "mneme_test_uptime_seconds", .help = "Uptime."},
                      [] { return 42.25; })
                  .ok());
  HistogramFamily* latency =
      Must(registry.AddHistogram({.name = "mneme_test_latency_seconds",
                                  .help = "Step latency.",
                                  .label_names = {"phase"}},
                                 {0.5, 1, 2.5}));
  Histogram* decode = Must(latency->Get({"decode"}));
  for (double v : {0.25, 0.5, 0.75, 3.0}) decode->Observe(v);
  Must(latency->Get({"prefill"}))->Observe(1);
  Must(Must(registry.AddHistogram({.name = "mneme_test_sizes_bytes"}, {}))
           ->Get())
      ->Observe(10);
  Must(registry.AddGauge({.name = "mneme_test_unused",
                          .help = "No series yet.",
                          .label_names = {"x"}}));
  CounterFamily* capped =
      Must(registry.AddCounter({.name = "mneme_test_capped_total",
                                .label_names = {"id"},
                                .max_series = 2}));
  for (const char* id : {"1", "2", "3", "4"}) {
    Must(capped->Get({id}))->Increment();
  }

  auto server = MustCreate({}, &registry);
  httplib::Result metrics = HttpGet(server->port(), "/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  ASSERT_EQ(metrics->status, 200);

  const std::string dir = testing::MakeTempDir("prometheus_scrape");
  const std::string scrape_path = dir + "/scrape.txt";
  const std::string expected_path = dir + "/expected.json";
  WriteFile(scrape_path, metrics->body);
  WriteFile(expected_path, R"json({"families": [
  {"name": "mneme_test_capped_total", "type": "counter", "samples": [
    ["mneme_test_capped_total", {"id": "1"}, 1],
    ["mneme_test_capped_total", {"id": "2"}, 1],
    ["mneme_test_capped_total", {"id": "__overflow__"}, 2]]},
  {"name": "mneme_test_latency_seconds", "type": "histogram",
   "help": "Step latency.", "samples": [
    ["mneme_test_latency_seconds_bucket", {"phase": "decode", "le": "0.5"}, 2],
    ["mneme_test_latency_seconds_bucket", {"phase": "decode", "le": "1"}, 3],
    ["mneme_test_latency_seconds_bucket", {"phase": "decode", "le": "2.5"}, 3],
    ["mneme_test_latency_seconds_bucket", {"phase": "decode", "le": "+Inf"}, 4],
    ["mneme_test_latency_seconds_sum", {"phase": "decode"}, 4.5],
    ["mneme_test_latency_seconds_count", {"phase": "decode"}, 4],
    ["mneme_test_latency_seconds_bucket", {"phase": "prefill", "le": "0.5"}, 0],
    ["mneme_test_latency_seconds_bucket", {"phase": "prefill", "le": "1"}, 1],
    ["mneme_test_latency_seconds_bucket", {"phase": "prefill", "le": "2.5"}, 1],
    ["mneme_test_latency_seconds_bucket", {"phase": "prefill", "le": "+Inf"}, 1],
    ["mneme_test_latency_seconds_sum", {"phase": "prefill"}, 1],
    ["mneme_test_latency_seconds_count", {"phase": "prefill"}, 1]]},
  {"name": "mneme_test_queue_depth", "type": "gauge",
   "help": "Line one\nback\\slash", "samples": [
    ["mneme_test_queue_depth", {"queue": "a\"b\\c\nd"}, 7.5],
    ["mneme_test_queue_depth", {"queue": "plain"}, -2]]},
  {"name": "mneme_test_requests_total", "type": "counter",
   "help": "Requests handled.", "samples": [
    ["mneme_test_requests_total", {"method": "Generate", "code": "OK"}, 3],
    ["mneme_test_requests_total",
     {"method": "Generate", "code": "UNAVAILABLE"}, 1]]},
  {"name": "mneme_test_restarts", "type": "counter", "samples": [
    ["mneme_test_restarts", {}, 0]]},
  {"name": "mneme_test_sizes_bytes", "type": "histogram", "samples": [
    ["mneme_test_sizes_bytes_bucket", {"le": "+Inf"}, 1],
    ["mneme_test_sizes_bytes_sum", {}, 10],
    ["mneme_test_sizes_bytes_count", {}, 1]]},
  {"name": "mneme_test_unused", "type": "gauge", "help": "No series yet.",
   "samples": []},
  {"name": "mneme_test_uptime_seconds", "type": "gauge", "help": "Uptime.",
   "samples": [["mneme_test_uptime_seconds", {}, 42.25]]}
]})json");

  auto checker = Must(testing::Subprocess::Start(
      {"/usr/bin/python3",
       testing::RunfilePath("mneme/tests/common/check_prometheus_text.py"),
       scrape_path, expected_path}));
  const int exit_code = Must(checker->Wait(absl::Seconds(60)));
  EXPECT_EQ(exit_code, 0) << "scrape:\n"
                          << metrics->body << "\nchecker stdout:\n"
                          << checker->Stdout() << "\nchecker stderr:\n"
                          << checker->Stderr();
}

TEST(MetricsHttpServerTest, AddressInUseIsUnavailableAndNamesTheAddress) {
  MetricsRegistry registry;
  auto first = MustCreate({}, &registry);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Create({.port = first->port()}, &registry,
                                [] { return true; });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                absl::StrCat("127.0.0.1:", first->port())))
      << second.status();
  // The first server is unaffected.
  httplib::Result healthz = HttpGet(first->port(), "/healthz");
  ASSERT_TRUE(healthz) << httplib::to_string(healthz.error());
  EXPECT_EQ(healthz->status, 200);
}

TEST(MetricsHttpServerTest, NonLocalAddressIsUnavailable) {
  MetricsRegistry registry;
  // 192.0.2.0/24 is reserved for documentation (TEST-NET-1): never local.
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Create({.host = "192.0.2.1"}, &registry,
                                [] { return true; });
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(server.status().message(), "192.0.2.1:0"))
      << server.status();
}

TEST(MetricsHttpServerTest, BadOptionsAreInvalidArgument) {
  MetricsRegistry registry;
  const auto ready = [] { return true; };
  for (const MetricsHttpServerOptions& options :
       {MetricsHttpServerOptions{.host = ""},
        MetricsHttpServerOptions{.port = -1},
        MetricsHttpServerOptions{.port = 65536},
        MetricsHttpServerOptions{.num_threads = 0},
        MetricsHttpServerOptions{.num_threads = 65},
        MetricsHttpServerOptions{.max_queued_connections = 0},
        MetricsHttpServerOptions{.io_timeout_seconds = 0}}) {
    EXPECT_EQ(
        MetricsHttpServer::Create(options, &registry, ready).status().code(),
        absl::StatusCode::kInvalidArgument)
        << options.host << ":" << options.port;
  }
  EXPECT_EQ(MetricsHttpServer::Create({}, nullptr, ready).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Create({}, &registry, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsHttpServerTest, StopIsIdempotentAndReleasesThePort) {
  MetricsRegistry registry;
  auto server = MustCreate({.num_threads = 1}, &registry);
  const int port = server->port();
  ASSERT_TRUE(HttpGet(port, "/healthz"));
  server->Stop();
  server->Stop();
  EXPECT_FALSE(HttpGet(port, "/healthz"));
  server.reset();

  // The same port can be bound again right away.
  auto again = MustCreate({.port = port}, &registry);
  EXPECT_EQ(again->port(), port);
  httplib::Result healthz = HttpGet(port, "/healthz");
  ASSERT_TRUE(healthz) << httplib::to_string(healthz.error());
  EXPECT_EQ(healthz->status, 200);
}

TEST(MetricsHttpServerTest, StopRightAfterCreateReturns) {
  MetricsRegistry registry;
  for (int i = 0; i < 20; ++i) {
    auto server = MustCreate({}, &registry);
    server->Stop();
  }
}

}  // namespace
}  // namespace mneme
