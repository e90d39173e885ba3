#ifndef MNEME_TOOLS_QUANT_PROGRESS_PRINTER_H_
#define MNEME_TOOLS_QUANT_PROGRESS_PRINTER_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mneme::quant {

// A progress line on a stream (stderr): "<label>: done / total rows (p%),
// r rows/s, ETA t". On a terminal the line is redrawn in place; otherwise a
// line is written at most once per `interval` and at completion. Not
// thread-safe.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(std::FILE* stream,
                           absl::Duration interval = absl::Seconds(1));

  // `rows_this_run` rows took `seconds` (the rate); `done` of `total` are
  // complete (the fraction and the ETA).
  void Update(absl::string_view label, int64_t done, int64_t total,
              int64_t rows_this_run, double seconds);

 private:
  std::FILE* stream_;
  absl::Duration interval_;
  bool terminal_;
  absl::Time last_ = absl::InfinitePast();
  std::string last_label_;
};

// "1h02m", "3m04s", "12s".
std::string FormatDuration(double seconds);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_PROGRESS_PRINTER_H_
