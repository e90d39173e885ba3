#include "tools/cli/cast_experts_command.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "tools/cli/args.h"
#include "tools/quant/expert_caster.h"
#include "tools/quant/progress_printer.h"

namespace mneme::cli {

absl::Status RunCastExperts(const std::vector<std::string>& argv,
                            std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv, {"checkpoint", "out", "calibration", "threads"},
                  {"uncalibrated"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        "cast-experts takes no positional arguments");
  }
  quant::ExpertCastOptions options;
  ASSIGN_OR_RETURN(std::string checkpoint, args.Required("checkpoint"));
  ASSIGN_OR_RETURN(std::string out_dir, args.Required("out"));
  options.checkpoint_dir = checkpoint;
  options.out_dir = out_dir;
  options.calibration_path = args.Get("calibration", "");
  options.input_scales = args.Get("uncalibrated", "false") == "true"
                             ? quant::InputScales::kUncalibrated
                             : quant::InputScales::kCalibrated;
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0, 0, 4096));
  options.threads = static_cast<int>(threads);
  quant::ProgressPrinter printer(stderr);
  const absl::Time start = absl::Now();
  options.progress = [&](int64_t done, int64_t total) {
    printer.Update("expert weights", done, total, done,
                   absl::ToDoubleSeconds(absl::Now() - start));
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(nlohmann::json report,
                   quant::CastExpertsCheckpoint(options));
  const nlohmann::json& r = report;
  out << absl::StrFormat(
      "wrote %s: %d expert weights cast MXFP4 -> NVFP4; %d of %d blocks "
      "lossless, max dequantization error %.9g; input scales %s; report "
      "%s/%s\n",
      out_dir, JsonFieldOr(r, "expert_weights", int64_t{0}),
      JsonFieldOr(r, "lossless_blocks", int64_t{0}),
      JsonFieldOr(r, "blocks", int64_t{0}),
      JsonFieldOr(r, "max_abs_error", 0.0),
      JsonFieldOr(r, "input_scales", std::string()), out_dir,
      quant::kExpertReportFileName);
  return absl::OkStatus();
}

}  // namespace mneme::cli
