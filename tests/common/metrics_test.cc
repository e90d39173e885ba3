#include "common/metrics.h"

#include <glog/logging.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mneme {
namespace {

// Test preconditions: a failure here means the fixture itself is broken.
template <typename T>
T Must(absl::StatusOr<T> result) {
  CHECK(result.ok()) << result.status();
  return *std::move(result);
}

// The value text of the sample line that starts with `series` (name and
// labels exactly as exported), or nullopt when there is none.
std::optional<std::string> SampleText(const std::string& text,
                                      absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series) && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::string(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

TEST(CounterTest, IncrementsAndIgnoresNegativeAndNaNDeltas) {
  Counter counter;
  EXPECT_EQ(counter.Value(), 0);
  counter.Increment();
  counter.Increment(2.5);
  counter.Increment(-10);
  counter.Increment(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(counter.Value(), 3.5);
}

TEST(GaugeTest, SetsIncrementsAndDecrements) {
  Gauge gauge;
  gauge.Set(10);
  gauge.Increment();
  gauge.Increment(4);
  gauge.Decrement(20);
  gauge.Decrement();
  EXPECT_EQ(gauge.Value(), -6);
}

TEST(MetricsRegistryTest, SameLabelValuesGiveTheSameSeries) {
  MetricsRegistry registry;
  CounterFamily* family =
      Must(registry.AddCounter({.name = "rpcs_total",
                                .help = "RPCs.",
                                .label_names = {"method", "code"}}));
  Counter* a = Must(family->Get({"Generate", "OK"}));
  Counter* b = Must(family->Get({"Generate", "OK"}));
  Counter* c = Must(family->Get({"Generate", "UNAVAILABLE"}));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  a->Increment();
  b->Increment();
  EXPECT_EQ(a->Value(), 2);
  EXPECT_EQ(c->Value(), 0);
  EXPECT_EQ(family->series_count(), 2);
}

TEST(MetricsRegistryTest, WrongNumberOfLabelValuesIsInvalidArgument) {
  MetricsRegistry registry;
  CounterFamily* family = Must(
      registry.AddCounter({.name = "rpcs_total", .label_names = {"method"}}));
  EXPECT_EQ(family->Get({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->Get({"a", "b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->series_count(), 0);
}

TEST(MetricsRegistryTest, UnlabelledFamilyHasItsSeriesFromTheStart) {
  MetricsRegistry registry;
  GaugeFamily* family = Must(registry.AddGauge({.name = "up"}));
  EXPECT_EQ(family->series_count(), 1);
  EXPECT_EQ(SampleText(registry.ExportText(), "up"), "0");
  Must(family->Get())->Set(1);
  EXPECT_EQ(SampleText(registry.ExportText(), "up"), "1");
}

class InvalidMetricNameTest : public testing::TestWithParam<std::string> {};

TEST_P(InvalidMetricNameTest, IsInvalidArgument) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddCounter({.name = GetParam()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge({.name = GetParam()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram({.name = GetParam()}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCallbackGauge({.name = GetParam()}, [] { return 1.0; })
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.ExportText(), "");
}

INSTANTIATE_TEST_SUITE_P(Names, InvalidMetricNameTest,
                         testing::Values("", "1abc", "a-b", "a b", "a.b",
                                         "caf\xc3\xa9", "a{b}", "a\nb"));

TEST(MetricsRegistryTest, AcceptsValidMetricNames) {
  MetricsRegistry registry;
  for (const char* name : {"a", "_a", ":a", "a:b_c9", "mneme_rows_total"}) {
    EXPECT_TRUE(registry.AddCounter({.name = name}).ok()) << name;
  }
}

class InvalidLabelNameTest : public testing::TestWithParam<std::string> {};

TEST_P(InvalidLabelNameTest, IsInvalidArgument) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddCounter({.name = "c", .label_names = {GetParam()}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Names, InvalidLabelNameTest,
                         testing::Values("", "1a", "a:b", "a-b", "__name__",
                                         "__reserved", "a b"));

TEST(MetricsRegistryTest, RejectsBadLabelSetsAndMaxSeries) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddGauge({.name = "g", .label_names = {"a", "b", "a"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram({.name = "h", .label_names = {"le"}}, {1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // "le" is only reserved for histograms.
  EXPECT_TRUE(registry.AddGauge({.name = "g", .label_names = {"le"}}).ok());
  EXPECT_EQ(registry.AddCounter({.name = "c", .max_series = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsRegistryTest, ReRegisteringTheSameDefinitionReturnsTheFamily) {
  MetricsRegistry registry;
  const MetricSpec spec = {
      .name = "latency_seconds", .help = "Latency.", .label_names = {"op"}};
  HistogramFamily* first = Must(registry.AddHistogram(spec, {0.1, 1}));
  HistogramFamily* second = Must(registry.AddHistogram(spec, {0.1, 1}));
  EXPECT_EQ(first, second);
}

TEST(MetricsRegistryTest, ReRegisteringADifferentDefinitionIsAlreadyExists) {
  MetricsRegistry registry;
  Must(registry.AddCounter({.name = "x", .help = "X.", .label_names = {"a"}}));
  Must(registry.AddHistogram({.name = "h"}, {1, 2}));
  // Another type, other labels, other help, other cap, other buckets.
  EXPECT_EQ(registry.AddGauge({.name = "x", .help = "X.", .label_names = {"a"}})
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(
      registry.AddCounter({.name = "x", .help = "X.", .label_names = {"b"}})
          .status()
          .code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounter({.name = "x", .help = "X."}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(
      registry.AddCounter({.name = "x", .help = "Y.", .label_names = {"a"}})
          .status()
          .code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry
                .AddCounter({.name = "x",
                             .help = "X.",
                             .label_names = {"a"},
                             .max_series = 5})
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddHistogram({.name = "h"}, {1, 3}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCallbackGauge({.name = "x"}, [] { return 1.0; }).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsRegistryTest, CollidingSampleNamesAreAlreadyExists) {
  MetricsRegistry registry;
  Must(registry.AddHistogram({.name = "h"}, {1}));
  EXPECT_EQ(registry.AddCounter({.name = "h_count"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge({.name = "h_bucket"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  Must(registry.AddGauge({.name = "g_sum"}));
  EXPECT_EQ(registry.AddHistogram({.name = "g"}, {1}).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Nothing half-registered is left behind.
  EXPECT_TRUE(registry.AddCounter({.name = "g"}).ok());
}

TEST(MetricsRegistryTest, SeriesPastTheCapShareTheOverflowSeries) {
  MetricsRegistry registry;
  CounterFamily* family =
      Must(registry.AddCounter({.name = "by_tenant_total",
                                .label_names = {"tenant", "model"},
                                .max_series = 2}));
  Counter* a = Must(family->Get({"a", "m"}));
  Counter* b = Must(family->Get({"b", "m"}));
  Counter* c = Must(family->Get({"c", "m"}));
  Counter* d = Must(family->Get({"d", "m"}));
  EXPECT_NE(a, b);
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(c, d);
  // Existing series stay reachable; the overflow series is addressable too.
  EXPECT_EQ(Must(family->Get({"a", "m"})), a);
  EXPECT_EQ(Must(family->Get({"__overflow__", "__overflow__"})), c);
  EXPECT_EQ(family->series_count(), 3);
  for (int i = 0; i < 100; ++i) {
    Must(family->Get({absl::StrCat("t", i), "m"}))->Increment();
  }
  EXPECT_EQ(family->series_count(), 3);
  EXPECT_EQ(c->Value(), 100);
  EXPECT_EQ(SampleText(registry.ExportText(),
                       "by_tenant_total{tenant=\"__overflow__\",model=\"__"
                       "overflow__\"}"),
            "100");
}

TEST(MetricsRegistryTest, ExportsTheTextFormatInStableOrder) {
  MetricsRegistry registry;
  // Registered out of name order on purpose.
  GaugeFamily* temperature = Must(registry.AddGauge({.name = "b_temperature"}));
  HistogramFamily* latency = Must(registry.AddHistogram(
      {.name = "c_latency_seconds", .help = "Latency.", .label_names = {"op"}},
      {0.5, 1}));
  CounterFamily* requests =
      Must(registry.AddCounter({.name = "a_requests_total",
                                .help = "Requests.\nSecond line \\ end",
                                .label_names = {"method", "code"}}));
  Must(registry.AddGauge(
      {.name = "d_unused", .help = "No series yet.", .label_names = {"x"}}));

  Must(requests->Get({"we\"ird\\va\nl", "500"}))->Increment();
  Must(requests->Get({"get", "200"}))->Increment(3);
  Must(temperature->Get())->Set(-1.5);
  Histogram* read = Must(latency->Get({"read"}));
  for (double v : {0.25, 0.5, 0.75, 2.0}) read->Observe(v);

  EXPECT_EQ(registry.ExportText(),
            R"(# HELP a_requests_total Requests.\nSecond line \\ end
# TYPE a_requests_total counter
a_requests_total{method="get",code="200"} 3
a_requests_total{method="we\"ird\\va\nl",code="500"} 1
# TYPE b_temperature gauge
b_temperature -1.5
# HELP c_latency_seconds Latency.
# TYPE c_latency_seconds histogram
c_latency_seconds_bucket{op="read",le="0.5"} 2
c_latency_seconds_bucket{op="read",le="1"} 3
c_latency_seconds_bucket{op="read",le="+Inf"} 4
c_latency_seconds_sum{op="read"} 3.5
c_latency_seconds_count{op="read"} 4
# HELP d_unused No series yet.
# TYPE d_unused gauge
)");
}

TEST(MetricsRegistryTest, FormatsValuesExactly) {
  MetricsRegistry registry;
  GaugeFamily* family =
      Must(registry.AddGauge({.name = "g", .label_names = {"k"}}));
  Must(family->Get({"big"}))->Set(123456789);
  Must(family->Get({"tenth"}))->Set(0.1);
  Must(family->Get({"inf"}))->Set(std::numeric_limits<double>::infinity());
  Must(family->Get({"ninf"}))->Set(-std::numeric_limits<double>::infinity());
  Must(family->Get({"nan"}))->Set(std::numeric_limits<double>::quiet_NaN());
  Must(family->Get({"third"}))->Set(1.0 / 3);
  const std::string text = registry.ExportText();
  EXPECT_EQ(SampleText(text, "g{k=\"big\"}"), "123456789");
  EXPECT_EQ(SampleText(text, "g{k=\"tenth\"}"), "0.1");
  EXPECT_EQ(SampleText(text, "g{k=\"inf\"}"), "+Inf");
  EXPECT_EQ(SampleText(text, "g{k=\"ninf\"}"), "-Inf");
  EXPECT_EQ(SampleText(text, "g{k=\"nan\"}"), "NaN");
  // Round-trips exactly.
  EXPECT_EQ(std::stod(*SampleText(text, "g{k=\"third\"}")), 1.0 / 3);
}

TEST(HistogramTest, CountsIntoBucketsWithInclusiveUpperBounds) {
  MetricsRegistry registry;
  HistogramFamily* family =
      Must(registry.AddHistogram({.name = "h"}, {1, 2, 4}));
  Histogram* histogram = Must(family->Get());
  for (double v : {-5.0, 1.0, 1.5, 2.0, 4.0, 4.5, 100.0}) histogram->Observe(v);
  histogram->Observe(std::numeric_limits<double>::quiet_NaN());

  const HistogramSnapshot snapshot = histogram->Snapshot();
  EXPECT_EQ(snapshot.bucket_bounds, (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(snapshot.bucket_counts, (std::vector<uint64_t>{2, 2, 1, 3}));
  EXPECT_EQ(snapshot.count, 8);
  EXPECT_TRUE(std::isnan(snapshot.sum));

  const std::string text = registry.ExportText();
  EXPECT_EQ(SampleText(text, "h_bucket{le=\"1\"}"), "2");
  EXPECT_EQ(SampleText(text, "h_bucket{le=\"2\"}"), "4");
  EXPECT_EQ(SampleText(text, "h_bucket{le=\"4\"}"), "5");
  EXPECT_EQ(SampleText(text, "h_bucket{le=\"+Inf\"}"), "8");
  EXPECT_EQ(SampleText(text, "h_count"), "8");
  EXPECT_EQ(SampleText(text, "h_sum"), "NaN");
}

TEST(HistogramTest, WithoutBoundsHasOnlyTheInfBucket) {
  MetricsRegistry registry;
  Histogram* histogram =
      Must(Must(registry.AddHistogram({.name = "sizes_bytes"}, {}))->Get());
  histogram->Observe(10);
  histogram->Observe(22);
  EXPECT_EQ(registry.ExportText(), R"(# TYPE sizes_bytes histogram
sizes_bytes_bucket{le="+Inf"} 2
sizes_bytes_sum 32
sizes_bytes_count 2
)");
}

TEST(HistogramTest, BadBucketBoundsAreInvalidArgument) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::vector<double>& bounds : std::vector<std::vector<double>>{
           {2, 1}, {1, 1}, {1, nan}, {1, inf}, {-inf, 1}}) {
    MetricsRegistry registry;
    EXPECT_EQ(registry.AddHistogram({.name = "h"}, bounds).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bounds.size();
  }
}

TEST(HistogramTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 4),
            (std::vector<double>{0.001, 0.001 * 10, 0.001 * 10 * 10,
                                 0.001 * 10 * 10 * 10}));
  EXPECT_EQ(LinearBuckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
  MetricsRegistry registry;
  EXPECT_TRUE(
      registry.AddHistogram({.name = "a"}, ExponentialBuckets(1e-4, 2, 20))
          .ok());
  // A factor of 1 repeats the bound: rejected at registration.
  EXPECT_EQ(registry.AddHistogram({.name = "b"}, ExponentialBuckets(1, 1, 3))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CallbackGaugeTest, IsReadAtExportAndCanBeRemoved) {
  MetricsRegistry registry;
  double depth = 3;
  ASSERT_TRUE(registry
                  .AddCallbackGauge({.name = "queue_depth", .help = "Depth."},
                                    [&depth] { return depth; })
                  .ok());
  EXPECT_EQ(registry.ExportText(), R"(# HELP queue_depth Depth.
# TYPE queue_depth gauge
queue_depth 3
)");
  depth = 4.5;
  EXPECT_EQ(SampleText(registry.ExportText(), "queue_depth"), "4.5");

  EXPECT_EQ(
      registry.AddCallbackGauge({.name = "queue_depth"}, [] { return 0.0; })
          .code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddGauge({.name = "queue_depth"}).status().code(),
            absl::StatusCode::kAlreadyExists);

  EXPECT_TRUE(registry.RemoveCallbackGauge("queue_depth").ok());
  EXPECT_EQ(registry.ExportText(), "");
  EXPECT_EQ(registry.RemoveCallbackGauge("queue_depth").code(),
            absl::StatusCode::kNotFound);
  // The name is free again.
  EXPECT_TRUE(registry.AddGauge({.name = "queue_depth"}).ok());
  // Only callback gauges can be removed.
  EXPECT_EQ(registry.RemoveCallbackGauge("queue_depth").code(),
            absl::StatusCode::kNotFound);
}

TEST(CallbackGaugeTest, RejectsLabelsAndEmptyCallbacks) {
  MetricsRegistry registry;
  EXPECT_EQ(registry
                .AddCallbackGauge({.name = "g", .label_names = {"a"}},
                                  [] { return 1.0; })
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddCallbackGauge({.name = "g"}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsRegistryTest, ConcurrentUpdatesLookupsAndExportsAreExact) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 20000;
  MetricsRegistry registry;
  CounterFamily* counters = Must(
      registry.AddCounter({.name = "ops_total", .label_names = {"thread"}}));
  Counter* shared = Must(counters->Get({"shared"}));
  Gauge* inflight = Must(Must(registry.AddGauge({.name = "inflight"}))->Get());
  Histogram* histogram =
      Must(Must(registry.AddHistogram({.name = "values"}, {0.5, 1.5}))->Get());

  std::atomic<bool> done{false};
  std::atomic<int> exports{0};
  std::atomic<int> inconsistent_exports{0};
  std::thread exporter([&] {
    while (!done.load()) {
      const std::string text = registry.ExportText();
      // Bucket counts and _count come from one read of the buckets.
      if (SampleText(text, "values_bucket{le=\"+Inf\"}") !=
          SampleText(text, "values_count")) {
        inconsistent_exports.fetch_add(1);
      }
      exports.fetch_add(1);
    }
  });
  std::vector<std::thread> workers;
  workers.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        shared->Increment();
        inflight->Increment();
        histogram->Observe(i % 3);
        // Lookups race with creation of other threads' series.
        Must(counters->Get({absl::StrCat("t", t, "_", i % 8)}))->Increment();
        inflight->Decrement(0.5);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  done.store(true);
  exporter.join();

  EXPECT_EQ(shared->Value(), kThreads * kIterations);
  EXPECT_EQ(inflight->Value(), kThreads * kIterations * 0.5);
  const HistogramSnapshot snapshot = histogram->Snapshot();
  EXPECT_EQ(snapshot.count, static_cast<uint64_t>(kThreads * kIterations));
  EXPECT_EQ(snapshot.bucket_counts[0] + snapshot.bucket_counts[1] +
                snapshot.bucket_counts[2],
            snapshot.count);
  EXPECT_EQ(counters->series_count(), 1 + kThreads * 8);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(Must(counters->Get({absl::StrCat("t", t, "_0")}))->Value(),
              kIterations / 8);
  }
  EXPECT_GT(exports.load(), 0);
  EXPECT_EQ(inconsistent_exports.load(), 0);
}

}  // namespace
}  // namespace mneme
