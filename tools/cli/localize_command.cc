#include "tools/cli/localize_command.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engram_store/hashing/column_split.h"
#include "engram_store/local_copy/local_copy_writer.h"
#include "tools/cli/args.h"

namespace mneme::cli {
namespace {

// Copies smaller than this finish before progress would be worth reading.
constexpr uint64_t kProgressMinBytes = 1ull << 30;
constexpr absl::Duration kProgressInterval = absl::Seconds(2);
constexpr int64_t kMaxTp = 1024;

double Megabytes(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

absl::StatusOr<engram::LocalCopyTarget> ParseTarget(const Args& args) {
  engram::LocalCopyTarget target;
  if (!args.Has("tp")) return absl::InvalidArgumentError("--tp is required");
  ASSIGN_OR_RETURN(int64_t tp, args.GetInt("tp", 1, 1, kMaxTp));
  target.tp_size = static_cast<int>(tp);
  ASSIGN_OR_RETURN(std::vector<int64_t> ranks, args.GetIntList("rank"));
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t rank = ranks[i];
    if (rank < 0 || rank >= tp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rank ", rank, " is outside [0, ", tp, ") for --tp ", tp));
    }
    if (i > 0 && rank == ranks[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rank ", rank, " is given twice"));
    }
    target.ranks.push_back(static_cast<int>(rank));
  }
  ASSIGN_OR_RETURN(
      std::string split,
      args.GetChoice("split", "strided", {"strided", "contiguous"}));
  ASSIGN_OR_RETURN(engram::ColumnSplit parsed, engram::ParseColumnSplit(split));
  target.split = parsed;
  return target;
}

}  // namespace

absl::Status RunLocalize(const std::vector<std::string>& argv,
                         std::ostream& out, std::ostream& err) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv, {"checkpoint", "out", "tp", "rank", "split", "threads"},
                  {"force"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("localize takes no positional arguments (got '",
                     args.positionals()[0], "')"));
  }
  engram::LocalizeOptions options;
  ASSIGN_OR_RETURN(std::string checkpoint, args.Required("checkpoint"));
  options.checkpoint_dir = checkpoint;
  ASSIGN_OR_RETURN(std::string out_dir, args.Required("out"));
  options.out_dir = out_dir;
  ASSIGN_OR_RETURN(engram::LocalCopyTarget target, ParseTarget(args));
  options.target = std::move(target);
  ASSIGN_OR_RETURN(int64_t threads,
                   args.GetInt("threads", options.threads, 1, 64));
  options.threads = static_cast<int>(threads);
  options.force = args.Get("force", "false") == "true";

  absl::Time last_report = absl::InfinitePast();
  options.on_range_done =
      [&](const engram::LocalizeProgress& p) -> absl::Status {
    const absl::Time now = absl::Now();
    if (p.bytes_total < kProgressMinBytes ||
        (now - last_report < kProgressInterval &&
         p.ranges_done != p.ranges_total)) {
      return absl::OkStatus();
    }
    last_report = now;
    const double seconds = std::max(absl::ToDoubleSeconds(p.elapsed), 1e-9);
    err << absl::StrFormat(
               "localize: %.1f of %.1f GB (%.0f%%), %d of %d ranges, "
               "%.0f MB/s copied",
               static_cast<double>(p.bytes_done) / 1e9,
               static_cast<double>(p.bytes_total) / 1e9,
               100.0 * static_cast<double>(p.bytes_done) /
                   static_cast<double>(p.bytes_total),
               p.ranges_done, p.ranges_total,
               Megabytes(p.bytes_copied) / seconds)
        << std::endl;
    return absl::OkStatus();
  };

  ASSIGN_OR_RETURN(engram::LocalizeSummary summary, engram::Localize(options));
  out << "localized " << engram::DescribeTarget(options.target) << " from "
      << options.checkpoint_dir << " into " << options.out_dir << "\n";
  for (const engram::LocalizeSummary::Layer& layer : summary.layers) {
    out << absl::StrFormat("layer %d: %s, %d rows, %d bytes, %d ranges\n",
                           layer.layer, formats::RowFormatName(layer.format),
                           layer.rows, layer.bytes, layer.ranges);
  }
  const double seconds = std::max(absl::ToDoubleSeconds(summary.elapsed), 1e-9);
  out << absl::StrFormat(
      "total: %d rows, %d bytes, %d ranges (%d copied, %d already present), "
      "%.3f s, %.1f MB/s\n",
      summary.rows, summary.bytes, summary.ranges, summary.ranges_copied,
      summary.ranges_reused, seconds,
      Megabytes(summary.bytes_copied) / seconds);
  out << "manifest: " << summary.manifest_path << "\n";
  return absl::OkStatus();
}

}  // namespace mneme::cli
