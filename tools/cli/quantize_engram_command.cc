#include "tools/cli/quantize_engram_command.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "tools/cli/args.h"
#include "tools/quant/blas.h"
#include "tools/quant/engram_quantizer.h"
#include "tools/quant/progress_printer.h"

namespace mneme::cli {
namespace {

std::atomic<bool> interrupted{false};

extern "C" void OnInterrupt(int) { interrupted.store(true); }

const char* PhaseName(quant::EngramProgress::Phase phase) {
  switch (phase) {
    case quant::EngramProgress::Phase::kAmax:
      return "amax";
    case quant::EngramProgress::Phase::kQuantize:
      return "quantize";
    case quant::EngramProgress::Phase::kVerify:
      return "verify";
  }
  return "?";
}

// Progress on stderr; Ctrl-C (SIGINT/SIGTERM) stops after the current step.
// For GPTQ, a note on slow BLAS kernels precedes the first step.
quant::EngramProgressCallback MakeProgress(quant::ProgressPrinter& printer,
                                           quant::ErrorFeedback feedback) {
  return [&printer, feedback, noted = false](
             const quant::EngramProgress& p) mutable -> absl::Status {
    if (feedback == quant::ErrorFeedback::kGptq && !noted &&
        p.phase == quant::EngramProgress::Phase::kQuantize) {
      noted = true;
      if (const std::string hint = quant::BlasKernelHint(); !hint.empty()) {
        absl::FPrintF(stderr, "note: %s\n", hint);
      }
    }
    printer.Update(absl::StrCat("layer ", p.layer, " ", PhaseName(p.phase)),
                   p.rows_done, p.rows_total, p.rows_this_run, p.seconds);
    if (interrupted.load()) {
      return absl::CancelledError(
          "interrupted; run the same command again to resume");
    }
    return absl::OkStatus();
  };
}

void PrintSummary(const nlohmann::json& report, std::ostream& out) {
  out << absl::StrFormat("%-6s %-10s %12s %10s %12s %10s %10s %9s %8s\n",
                         "layer", "method", "rows", "amax", "global_scale",
                         "rms_%", "wkv_rms_%", "underflow", "seconds");
  const auto tables = report.find("tables");
  if (tables == report.end() || !tables->is_array()) return;
  for (const nlohmann::json& t : *tables) {
    out << absl::StrFormat(
        "%-6d %-10s %12d %10.4g %12.6g %10.3f %10.3f %9d %8.1f\n",
        JsonFieldOr(t, "layer", 0), JsonFieldOr(t, "method", std::string()),
        JsonFieldOr(t, "rows", int64_t{0}), JsonFieldOr(t, "amax", 0.0),
        JsonFieldOr(t, "global_scale", 0.0),
        100 * JsonFieldOr(t, "relative_rms", 0.0),
        100 * JsonFieldOr(t, "wkv_relative_rms", 0.0),
        JsonFieldOr(t, "scale_underflows", int64_t{0}),
        JsonFieldOr(t, "seconds", 0.0));
  }
}

}  // namespace

absl::Status RunQuantizeEngram(const std::vector<std::string>& argv,
                               std::ostream& out) {
  ASSIGN_OR_RETURN(Args args,
                   Args::Parse(argv,
                               {"checkpoint", "out", "method", "rows-per-step",
                                "threads", "wkv-error-rows"},
                               {"verify"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        "quantize-engram takes no positional arguments");
  }
  quant::EngramQuantizeOptions options;
  ASSIGN_OR_RETURN(std::string checkpoint, args.Required("checkpoint"));
  ASSIGN_OR_RETURN(std::string out_dir, args.Required("out"));
  options.checkpoint_dir = checkpoint;
  options.out_dir = out_dir;
  ASSIGN_OR_RETURN(
      std::string method_name,
      args.GetChoice("method", "gptq-mse",
                     {"gptq-mse", "gptq-amax", "rtn-mse", "rtn-amax"}));
  options.method = *quant::ParseQuantMethod(method_name);
  ASSIGN_OR_RETURN(int64_t rows,
                   args.GetInt("rows-per-step", options.rows_per_step, 1,
                               std::numeric_limits<int64_t>::max() / 1024));
  options.rows_per_step = rows;
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0, 0, 4096));
  options.threads = static_cast<int>(threads);
  ASSIGN_OR_RETURN(int64_t wkv_rows,
                   args.GetInt("wkv-error-rows", options.wkv_error_rows, 1,
                               std::numeric_limits<int64_t>::max()));
  options.wkv_error_rows = wkv_rows;
  const bool verify = args.Get("verify", "false") == "true";
  options.verify =
      verify ? quant::VerifyOutput::kYes : quant::VerifyOutput::kNo;

  quant::ProgressPrinter printer(stderr);
  options.progress = MakeProgress(printer, options.method.feedback);
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);

  std::error_code ec;
  if (verify &&
      std::filesystem::exists(
          absl::StrCat(out_dir, "/", quant::kEngramReportFileName), ec)) {
    quant::EngramVerifyOptions v;
    v.checkpoint_dir = checkpoint;
    v.out_dir = out_dir;
    v.rows_per_step = options.rows_per_step;
    v.threads = options.threads;
    v.progress = options.progress;
    ASSIGN_OR_RETURN(nlohmann::json verified, quant::VerifyEngramCheckpoint(v));
    out << absl::StrFormat("verified %s against %s: the report holds\n",
                           out_dir, checkpoint);
    PrintSummary(verified, out);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(quant::EngramQuantReport report,
                   quant::QuantizeEngramCheckpoint(options));
  out << absl::StrFormat(
      "wrote %s: Engram tables NVFP4 (%s)%s%s, Engram shards %d -> %d bytes; "
      "report %s/%s\n",
      out_dir, report.method, report.resumed ? ", resumed" : "",
      report.verify.has_value() ? ", verified" : "", report.source_shard_bytes,
      report.output_shard_bytes, out_dir, quant::kEngramReportFileName);
  PrintSummary(report.ToJson(), out);
  return absl::OkStatus();
}

}  // namespace mneme::cli
