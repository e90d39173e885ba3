#include "common/metrics.h"

#include <glog/logging.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mneme {
namespace {

bool IsAsciiLetter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || IsAsciiDigit(name[0])) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return IsAsciiLetter(c) || IsAsciiDigit(c) || c == '_' || c == ':';
  });
}

// [a-zA-Z_][a-zA-Z0-9_]*, and "__" prefixes are reserved for Prometheus.
bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || IsAsciiDigit(name[0])) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return IsAsciiLetter(c) || IsAsciiDigit(c) || c == '_';
  });
}

using metrics_internal::FamilyKind;

absl::Status ValidateSpec(const MetricSpec& spec, FamilyKind kind,
                          absl::Span<const double> bucket_bounds) {
  if (!IsValidMetricName(spec.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", spec.name,
                     "\" does not match [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  if (spec.max_series < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", spec.name, ": max_series must be >= 1, got ",
                     spec.max_series));
  }
  if (kind == FamilyKind::kCallbackGauge && !spec.label_names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric ", spec.name, ": callback gauges take no label names"));
  }
  for (size_t i = 0; i < spec.label_names.size(); ++i) {
    const std::string& label = spec.label_names[i];
    if (!IsValidLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", spec.name, ": label name \"", label,
          "\" does not match [a-zA-Z_][a-zA-Z0-9_]* or starts with \"__\""));
    }
    if (kind == FamilyKind::kHistogram && label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", spec.name, ": histograms may not use the label \"le\""));
    }
    for (size_t j = 0; j < i; ++j) {
      if (spec.label_names[j] == label) {
        return absl::InvalidArgumentError(absl::StrCat(
            "metric ", spec.name, ": label name \"", label, "\" repeats"));
      }
    }
  }
  for (size_t i = 0; i < bucket_bounds.size(); ++i) {
    if (!std::isfinite(bucket_bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", spec.name, ": bucket bound ", i,
                       " is not finite (the +Inf bucket is implicit)"));
    }
    if (i > 0 && !(bucket_bounds[i - 1] < bucket_bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", spec.name,
                       ": bucket bounds must be strictly "
                       "ascending, but bound ",
                       i, " is not above bound ", i - 1));
    }
  }
  return absl::OkStatus();
}

// The sample names a family exports, which must be unique registry-wide.
std::vector<std::string> SampleNames(absl::string_view name, FamilyKind kind) {
  if (kind != FamilyKind::kHistogram) return {std::string(name)};
  return {std::string(name), absl::StrCat(name, "_bucket"),
          absl::StrCat(name, "_sum"), absl::StrCat(name, "_count")};
}

// Shortest text that reads back as the same double; Prometheus spellings
// for the non-finite values.
void AppendDouble(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
  } else if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
  } else {
    char buffer[32];
    const std::to_chars_result result =
        std::to_chars(buffer, buffer + sizeof(buffer), value);
    out->append(buffer, result.ptr);
  }
}

void AppendEscapedHelp(absl::string_view help, std::string* out) {
  for (char c : help) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

void AppendEscapedLabelValue(absl::string_view value, std::string* out) {
  for (char c : value) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '"') {
      out->append("\\\"");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

void AppendHeader(const MetricSpec& spec, absl::string_view type,
                  std::string* out) {
  if (!spec.help.empty()) {
    absl::StrAppend(out, "# HELP ", spec.name, " ");
    AppendEscapedHelp(spec.help, out);
    out->push_back('\n');
  }
  absl::StrAppend(out, "# TYPE ", spec.name, " ", type, "\n");
}

// `{a="x",b="y"}`, with le="<le>" last when `le` is non-empty; nothing when
// there are no labels at all.
void AppendLabels(const std::vector<std::string>& names,
                  const std::vector<std::string>& values, absl::string_view le,
                  std::string* out) {
  if (names.empty() && le.empty()) return;
  out->push_back('{');
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, names[i], "=\"");
    AppendEscapedLabelValue(values[i], out);
    out->push_back('"');
  }
  if (!le.empty()) {
    if (!names.empty()) out->push_back(',');
    absl::StrAppend(out, "le=\"", le, "\"");
  }
  out->push_back('}');
}

template <typename T>
constexpr absl::string_view TypeName() {
  if constexpr (std::is_same_v<T, Counter>) {
    return "counter";
  } else if constexpr (std::is_same_v<T, Gauge>) {
    return "gauge";
  } else {
    static_assert(std::is_same_v<T, Histogram>);
    return "histogram";
  }
}

// A gauge read from a callback at export time.
class CallbackGauge final : public metrics_internal::FamilyBase {
 public:
  CallbackGauge(MetricSpec spec, std::function<double()> callback)
      : spec_(std::move(spec)), callback_(std::move(callback)) {}

  void AppendText(std::string* out) const override {
    AppendHeader(spec_, "gauge", out);
    absl::StrAppend(out, spec_.name, " ");
    AppendDouble(callback_(), out);
    out->push_back('\n');
  }

 private:
  const MetricSpec spec_;
  const std::function<double()> callback_;
};

}  // namespace

// ---------------------------------------------------------------- Histogram

Histogram::Histogram(absl::Span<const double> bucket_bounds)
    : bucket_bounds_(bucket_bounds), bucket_counts_(bucket_bounds.size() + 1) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::isnan(value)
          ? bucket_bounds_.size()
          : static_cast<size_t>(std::lower_bound(bucket_bounds_.begin(),
                                                 bucket_bounds_.end(), value) -
                                bucket_bounds_.begin());
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot snapshot;
  snapshot.bucket_bounds.assign(bucket_bounds_.begin(), bucket_bounds_.end());
  snapshot.bucket_counts.reserve(bucket_counts_.size());
  for (const std::atomic<uint64_t>& count : bucket_counts_) {
    snapshot.bucket_counts.push_back(count.load(std::memory_order_relaxed));
    snapshot.count += snapshot.bucket_counts.back();
  }
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  bounds.reserve(std::max(count, 0));
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> bounds;
  bounds.reserve(std::max(count, 0));
  for (int i = 0; i < count; ++i) bounds.push_back(start + i * width);
  return bounds;
}

// ----------------------------------------------------------- LabelValuesLess

namespace metrics_internal {
namespace {

template <typename A, typename B>
bool LexicographicallyLess(const A& a, const B& b) {
  return std::lexicographical_compare(
      a.begin(), a.end(), b.begin(), b.end(),
      [](absl::string_view x, absl::string_view y) { return x < y; });
}

}  // namespace

bool LabelValuesLess::operator()(const std::vector<std::string>& a,
                                 const std::vector<std::string>& b) const {
  return LexicographicallyLess(a, b);
}
bool LabelValuesLess::operator()(const std::vector<std::string>& a,
                                 absl::Span<const absl::string_view> b) const {
  return LexicographicallyLess(a, b);
}
bool LabelValuesLess::operator()(absl::Span<const absl::string_view> a,
                                 const std::vector<std::string>& b) const {
  return LexicographicallyLess(a, b);
}

}  // namespace metrics_internal

// -------------------------------------------------------------- MetricFamily

template <typename T>
MetricFamily<T>::MetricFamily(MetricSpec spec,
                              std::vector<double> bucket_bounds)
    : spec_(std::move(spec)), bucket_bounds_(std::move(bucket_bounds)) {
  if (spec_.label_names.empty()) {
    // The only series exists from the start, so it is exported as 0 before
    // its first update.
    absl::MutexLock lock(&mu_);
    GetOrCreateLocked({});
  }
}

template <typename T>
absl::StatusOr<T*> MetricFamily<T>::Get(
    absl::Span<const absl::string_view> label_values) {
  if (label_values.size() != spec_.label_names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", spec_.name, " has ", spec_.label_names.size(),
                     " labels (", absl::StrJoin(spec_.label_names, ", "),
                     "), got ", label_values.size(), " label values"));
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = series_.find(label_values);
    if (it != series_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  return GetOrCreateLocked(label_values);
}

template <typename T>
T* MetricFamily<T>::GetOrCreateLocked(
    absl::Span<const absl::string_view> label_values) {
  auto it = series_.find(label_values);
  if (it != series_.end()) return it->second.get();

  const std::vector<absl::string_view> overflow_key(spec_.label_names.size(),
                                                    kOverflowLabelValue);
  const bool has_overflow_series =
      series_.find(absl::MakeConstSpan(overflow_key)) != series_.end();
  const size_t regular_series = series_.size() - (has_overflow_series ? 1 : 0);
  if (regular_series >= static_cast<size_t>(spec_.max_series)) {
    if (!overflowed_) {
      overflowed_ = true;
      LOG(WARNING) << "metric " << spec_.name
                   << " reached max_series=" << spec_.max_series
                   << "; new label values are counted in "
                   << "the series labelled " << kOverflowLabelValue;
    }
    if (has_overflow_series) {
      return series_.find(absl::MakeConstSpan(overflow_key))->second.get();
    }
    label_values = overflow_key;
  }

  std::unique_ptr<T> series;
  if constexpr (std::is_same_v<T, Histogram>) {
    series.reset(new Histogram(bucket_bounds_));
  } else {
    series = std::make_unique<T>();
  }
  T* result = series.get();
  series_.emplace(
      std::vector<std::string>(label_values.begin(), label_values.end()),
      std::move(series));
  return result;
}

template <typename T>
int MetricFamily<T>::series_count() const {
  absl::ReaderMutexLock lock(&mu_);
  return static_cast<int>(series_.size());
}

template <typename T>
void MetricFamily<T>::AppendText(std::string* out) const {
  AppendHeader(spec_, TypeName<T>(), out);
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [label_values, series] : series_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const HistogramSnapshot snapshot = series->Snapshot();
      uint64_t cumulative = 0;
      std::string le;
      for (size_t i = 0; i < snapshot.bucket_counts.size(); ++i) {
        cumulative += snapshot.bucket_counts[i];
        le.clear();
        if (i < snapshot.bucket_bounds.size()) {
          AppendDouble(snapshot.bucket_bounds[i], &le);
        } else {
          le = "+Inf";
        }
        absl::StrAppend(out, spec_.name, "_bucket");
        AppendLabels(spec_.label_names, label_values, le, out);
        absl::StrAppend(out, " ", cumulative, "\n");
      }
      absl::StrAppend(out, spec_.name, "_sum");
      AppendLabels(spec_.label_names, label_values, "", out);
      out->push_back(' ');
      AppendDouble(snapshot.sum, out);
      absl::StrAppend(out, "\n", spec_.name, "_count");
      AppendLabels(spec_.label_names, label_values, "", out);
      absl::StrAppend(out, " ", snapshot.count, "\n");
    } else {
      out->append(spec_.name);
      AppendLabels(spec_.label_names, label_values, "", out);
      out->push_back(' ');
      AppendDouble(series->Value(), out);
      out->push_back('\n');
    }
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

// ----------------------------------------------------------- MetricsRegistry

MetricsRegistry::~MetricsRegistry() = default;

absl::StatusOr<metrics_internal::FamilyBase*> MetricsRegistry::Register(
    Kind kind, const MetricSpec& spec, absl::Span<const double> bucket_bounds,
    const std::function<std::unique_ptr<metrics_internal::FamilyBase>()>&
        make) {
  if (absl::Status valid = ValidateSpec(spec, kind, bucket_bounds);
      !valid.ok()) {
    return valid;
  }
  const bool is_callback = kind == Kind::kCallbackGauge;

  absl::MutexLock lock(&mu_);
  auto it = families_.find(spec.name);
  if (it != families_.end()) {
    const Entry& entry = it->second;
    const bool same_definition =
        entry.kind == kind && entry.spec.help == spec.help &&
        entry.spec.label_names == spec.label_names &&
        entry.spec.max_series == spec.max_series &&
        std::equal(entry.bucket_bounds.begin(), entry.bucket_bounds.end(),
                   bucket_bounds.begin(), bucket_bounds.end());
    if (same_definition && !is_callback) return entry.family.get();
    return absl::AlreadyExistsError(absl::StrCat(
        "metric ", spec.name,
        is_callback ? " is already registered"
                    : " is already registered with a different type, help, "
                      "label names, max_series or buckets"));
  }
  std::vector<std::string> sample_names = SampleNames(spec.name, kind);
  for (const std::string& sample_name : sample_names) {
    auto owner = sample_names_.find(sample_name);
    if (owner != sample_names_.end()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric ", spec.name, " would export samples named ", sample_name,
          ", which metric ", owner->second, " already exports"));
    }
  }
  for (std::string& sample_name : sample_names) {
    sample_names_.emplace(std::move(sample_name), spec.name);
  }
  Entry& entry = families_[spec.name];
  entry.kind = kind;
  entry.spec = spec;
  entry.bucket_bounds.assign(bucket_bounds.begin(), bucket_bounds.end());
  entry.family = make();
  return entry.family.get();
}

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounter(
    const MetricSpec& spec) {
  ASSIGN_OR_RETURN(metrics_internal::FamilyBase * family,
                   Register(Kind::kCounter, spec, {}, [&spec] {
                     return std::unique_ptr<metrics_internal::FamilyBase>(
                         new CounterFamily(spec, {}));
                   }));
  return static_cast<CounterFamily*>(family);
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGauge(const MetricSpec& spec) {
  ASSIGN_OR_RETURN(metrics_internal::FamilyBase * family,
                   Register(Kind::kGauge, spec, {}, [&spec] {
                     return std::unique_ptr<metrics_internal::FamilyBase>(
                         new GaugeFamily(spec, {}));
                   }));
  return static_cast<GaugeFamily*>(family);
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogram(
    const MetricSpec& spec, absl::Span<const double> bucket_bounds) {
  ASSIGN_OR_RETURN(
      metrics_internal::FamilyBase * family,
      Register(Kind::kHistogram, spec, bucket_bounds, [&spec, bucket_bounds] {
        return std::unique_ptr<metrics_internal::FamilyBase>(
            new HistogramFamily(spec,
                                std::vector<double>(bucket_bounds.begin(),
                                                    bucket_bounds.end())));
      }));
  return static_cast<HistogramFamily*>(family);
}

absl::Status MetricsRegistry::AddCallbackGauge(
    const MetricSpec& spec, std::function<double()> callback) {
  if (!callback) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", spec.name, ": the callback is empty"));
  }
  return Register(Kind::kCallbackGauge, spec, {},
                  [&spec, &callback] {
                    return std::unique_ptr<metrics_internal::FamilyBase>(
                        new CallbackGauge(spec, std::move(callback)));
                  })
      .status();
}

absl::Status MetricsRegistry::RemoveCallbackGauge(absl::string_view name) {
  std::unique_ptr<metrics_internal::FamilyBase> removed;
  {
    absl::MutexLock lock(&mu_);
    auto it = families_.find(name);
    if (it == families_.end() || it->second.kind != Kind::kCallbackGauge) {
      return absl::NotFoundError(
          absl::StrCat("no callback gauge named ", name));
    }
    sample_names_.erase(it->second.spec.name);
    removed = std::move(it->second.family);
    families_.erase(it);
  }
  // Destroyed outside the lock: whatever the callback captured may take
  // time to release.
  return absl::OkStatus();
}

std::string MetricsRegistry::ExportText() const {
  std::string out;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, entry] : families_) entry.family->AppendText(&out);
  return out;
}

}  // namespace mneme
