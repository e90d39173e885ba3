#ifndef MNEME_COMMON_METRICS_H_
#define MNEME_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace mneme {

// Process metrics (counters, gauges, histograms with labels) exported in the
// Prometheus text exposition format 0.0.4.
//
// Usage: register a family once at startup, look up the series for a label
// tuple once (or rarely), keep the pointer and update it on the hot path:
//
//   MetricsRegistry registry;
//   CounterFamily* rpcs = *registry.AddCounter(
//       {.name = "mneme_rpcs_total", .help = "RPCs handled.",
//        .label_names = {"method", "code"}});
//   Counter* ok = *rpcs->Get({"Generate", "OK"});
//   ok->Increment();                      // a relaxed atomic add
//   std::string text = registry.ExportText();
//
// Bounds: each family holds at most `MetricSpec::max_series` series. Past it,
// every new label tuple is folded into one overflow series whose label values
// are all kOverflowLabelValue (a warning is logged once per family); Get()
// never fails because of the cap, so hot paths need no error handling for it.

// The `Content-Type` of ExportText() output.
inline constexpr absl::string_view kPrometheusTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Label value of every label of a family's overflow series.
inline constexpr absl::string_view kOverflowLabelValue = "__overflow__";

// Default for MetricSpec::max_series.
inline constexpr int kDefaultMaxSeries = 1000;

// What every metric family is registered with.
struct MetricSpec {
  // Metric name, matching [a-zA-Z_:][a-zA-Z0-9_:]*. By Prometheus convention
  // counters end in "_total" and units are base units ("_seconds",
  // "_bytes"). Required.
  std::string name = {};
  // One-line description, the "# HELP" line (backslashes and newlines are
  // escaped on export). Default: empty (no HELP line).
  std::string help = {};
  // Label names, each matching [a-zA-Z_][a-zA-Z0-9_]* and not starting with
  // "__"; distinct; histograms may not use "le". Default: none (the family
  // has exactly one series).
  std::vector<std::string> label_names = {};
  // Most series (distinct label-value tuples) the family keeps; new tuples
  // past it share one overflow series. Must be >= 1. Default: 1000.
  int max_series = kDefaultMaxSeries;
};

// A monotonically increasing value. Thread-safe; updates are lock-free.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta`; deltas that are negative or NaN are ignored (a counter
  // never goes down).
  void Increment(double delta = 1.0) {
    if (delta >= 0) value_.fetch_add(delta, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down. Thread-safe; updates are lock-free.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0) {
    value_.fetch_add(delta, std::memory_order_relaxed);
  }
  void Decrement(double delta = 1.0) {
    value_.fetch_sub(delta, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A consistent-enough copy of one histogram series.
struct HistogramSnapshot {
  // Upper bounds (inclusive) of the finite buckets, ascending.
  std::vector<double> bucket_bounds;
  // Observations per bucket, NOT cumulative; bucket_bounds.size() + 1
  // entries, the last one for (last bound, +Inf] and NaN.
  std::vector<uint64_t> bucket_counts;
  // Sum of bucket_counts.
  uint64_t count = 0;
  // Sum of all observed values (read separately from the counts, so a
  // concurrent Observe() may be in one and not yet in the other).
  double sum = 0;
};

// Observations counted into fixed buckets, plus their sum. Thread-safe;
// Observe() is lock-free (a binary search and two relaxed atomic adds).
class Histogram {
 public:
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` into the first bucket whose bound is >= value (NaN goes to
  // the +Inf bucket) and adds it to the sum.
  void Observe(double value);
  HistogramSnapshot Snapshot() const;

 private:
  template <typename T>
  friend class MetricFamily;
  // `bucket_bounds` is the family's and outlives the series.
  explicit Histogram(absl::Span<const double> bucket_bounds);

  const absl::Span<const double> bucket_bounds_;
  std::vector<std::atomic<uint64_t>> bucket_counts_;
  std::atomic<double> sum_{0.0};
};

// Bucket bounds start, start*factor, ..., `count` of them. Registration
// rejects the result unless start > 0 and factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// Bucket bounds start, start+width, ..., `count` of them. Registration
// rejects the result unless width > 0.
std::vector<double> LinearBuckets(double start, double width, int count);

namespace metrics_internal {

enum class FamilyKind { kCounter, kGauge, kHistogram, kCallbackGauge };

// Orders label-value tuples; transparent so lookups need no allocation.
struct LabelValuesLess {
  using is_transparent = void;
  bool operator()(const std::vector<std::string>& a,
                  const std::vector<std::string>& b) const;
  bool operator()(const std::vector<std::string>& a,
                  absl::Span<const absl::string_view> b) const;
  bool operator()(absl::Span<const absl::string_view> a,
                  const std::vector<std::string>& b) const;
};

// What the registry needs from every family.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  // Appends the family's HELP, TYPE and sample lines.
  virtual void AppendText(std::string* out) const = 0;
};

}  // namespace metrics_internal

// All series of one metric, one per label-value tuple. Created by
// MetricsRegistry, which owns it; series live as long as the registry.
// Thread-safe.
template <typename T>
class MetricFamily final : public metrics_internal::FamilyBase {
 public:
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  const MetricSpec& spec() const { return spec_; }

  // The series for `label_values` (in the order of spec().label_names),
  // created at zero on first use; the overflow series once max_series
  // series exist. The pointer stays valid for the registry's lifetime: look
  // it up once and keep it. InvalidArgument when the number of values is not
  // the number of label names.
  absl::StatusOr<T*> Get(absl::Span<const absl::string_view> label_values = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Distinct series held, the overflow series included.
  int series_count() const ABSL_LOCKS_EXCLUDED(mu_);

  void AppendText(std::string* out) const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class MetricsRegistry;
  MetricFamily(MetricSpec spec, std::vector<double> bucket_bounds);

  T* GetOrCreateLocked(absl::Span<const absl::string_view> label_values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MetricSpec spec_;
  // Histograms only: finite bucket bounds, ascending.
  const std::vector<double> bucket_bounds_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>,
           metrics_internal::LabelValuesLess>
      series_ ABSL_GUARDED_BY(mu_);
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

// Owns metric families and exports them. Construct one per process (main
// owns it and hands pointers to components); it must outlive every server
// exporting it and every pointer to its families and series. Thread-safe:
// registration, lookups, updates and exports may run concurrently.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  ~MetricsRegistry();

  // Register a family, or return the existing one when a family with the same
  // name and the identical definition (type, help, label names, max_series
  // and, for histograms, bucket bounds) exists. InvalidArgument for a bad
  // name, label name, max_series or bucket bounds; AlreadyExists when the
  // name is taken by a different definition, or when the exported sample
  // names collide with another family's (a histogram "x" exports x_bucket,
  // x_sum and x_count).
  absl::StatusOr<CounterFamily*> AddCounter(const MetricSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<GaugeFamily*> AddGauge(const MetricSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `bucket_bounds`: finite, strictly ascending upper bounds (the +Inf bucket
  // is implicit); may be empty.
  absl::StatusOr<HistogramFamily*> AddHistogram(
      const MetricSpec& spec, absl::Span<const double> bucket_bounds)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Registers a gauge whose value is `callback()` at export time (queue
  // depths, cache sizes, anything already counted elsewhere). The callback
  // runs on the exporting thread with the registry's lock held: it must be
  // thread-safe, cheap, and must not call into the registry. It is kept
  // until RemoveCallbackGauge() or the registry's destruction, so whatever it
  // captures must live that long. InvalidArgument for a bad name, non-empty
  // label_names or an empty callback; AlreadyExists when the name is taken.
  absl::Status AddCallbackGauge(const MetricSpec& spec,
                                std::function<double()> callback)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a callback gauge; once this returns the callback is not running
  // and will not run again. NotFound when `name` is not a callback gauge.
  absl::Status RemoveCallbackGauge(absl::string_view name)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every family in the Prometheus text format 0.0.4: families sorted by
  // name, series by label values, "# HELP" (when help is set) and "# TYPE"
  // before each family's samples; label values escape backslash, double
  // quote and newline; histograms export cumulative _bucket{le="..."} series
  // ending in le="+Inf", then _sum and _count.
  std::string ExportText() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Kind = metrics_internal::FamilyKind;
  struct Entry {
    Kind kind;
    MetricSpec spec;
    std::vector<double> bucket_bounds;
    std::unique_ptr<metrics_internal::FamilyBase> family;
  };

  // Finds or creates the entry for `spec`; `make` builds the family.
  absl::StatusOr<metrics_internal::FamilyBase*> Register(
      Kind kind, const MetricSpec& spec, absl::Span<const double> bucket_bounds,
      const std::function<std::unique_ptr<metrics_internal::FamilyBase>()>&
          make) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Entry, std::less<>> families_ ABSL_GUARDED_BY(mu_);
  // Every exported sample name -> the family exporting it.
  absl::flat_hash_map<std::string, std::string> sample_names_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme

#endif  // MNEME_COMMON_METRICS_H_
