#include "tools/quant/progress_printer.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace mneme::quant {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

ProgressPrinter::ProgressPrinter(std::FILE* stream, absl::Duration interval)
    : stream_(stream),
      interval_(interval),
      terminal_(::isatty(::fileno(stream)) != 0) {}

void ProgressPrinter::Update(absl::string_view label, int64_t done,
                             int64_t total, int64_t rows_this_run,
                             double seconds) {
  const absl::Time now = absl::Now();
  const bool complete = done >= total;
  if (!complete && now - last_ < interval_ && label == last_label_) return;
  last_ = now;
  last_label_ = std::string(label);
  const double rate = seconds > 0 ? rows_this_run / seconds : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : -1.0;
  const std::string line = absl::StrFormat(
      "%s: %d / %d rows (%.1f%%), %.0f rows/s, %s %s", label, done, total,
      total > 0 ? 100.0 * done / total : 100.0, rate, complete ? "took" : "ETA",
      FormatDuration(complete ? seconds : eta));
  if (terminal_) {
    absl::FPrintF(stream_, "\r\033[K%s%s", line, complete ? "\n" : "");
  } else {
    absl::FPrintF(stream_, "%s\n", line);
  }
  std::fflush(stream_);
}

}  // namespace mneme::quant
