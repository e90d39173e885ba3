#include "tools/cli/make_checkpoint_command.h"

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/cli/args.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::cli {

absl::Status RunMakeCheckpoint(const std::vector<std::string>& argv,
                               std::ostream& out) {
  absl::StatusOr<Args> args = Args::Parse(
      argv, {"out", "engram-format", "seed", "engram-vocab-size", "threads"});
  if (!args.ok()) return args.status();
  if (!args->positionals().empty()) {
    return absl::InvalidArgumentError(
        "make-checkpoint takes no positional arguments");
  }
  synthetic::SyntheticCheckpointOptions options;
  absl::StatusOr<std::string> out_dir = args->Required("out");
  if (!out_dir.ok()) return out_dir.status();
  options.out_dir = *out_dir;
  absl::StatusOr<std::string> format =
      args->GetChoice("engram-format", "fp8", {"fp8", "nvfp4"});
  if (!format.ok()) return format.status();
  options.engram_format =
      *format == "fp8" ? engram::RowFormat::kFp8 : engram::RowFormat::kNvfp4;
  absl::StatusOr<int64_t> seed =
      args->GetInt("seed", 0, 0, std::numeric_limits<int64_t>::max());
  if (!seed.ok()) return seed.status();
  options.seed = static_cast<uint64_t>(*seed);
  absl::StatusOr<int64_t> vocab =
      args->GetInt("engram-vocab-size", options.engram_vocab_size, 100,
                   (int64_t{1} << 31) - 1);
  if (!vocab.ok()) return vocab.status();
  options.engram_vocab_size = *vocab;
  absl::StatusOr<int64_t> threads = args->GetInt("threads", 0, 0, 1024);
  if (!threads.ok()) return threads.status();
  options.threads = static_cast<int>(*threads);

  const absl::Time start = absl::Now();
  if (absl::Status s = synthetic::MakeSyntheticCheckpoint(options); !s.ok()) {
    return s;
  }
  out << absl::StrFormat(
      "wrote %s: synthetic checkpoint, %s Engram tables, seed %d, %.1f s\n",
      options.out_dir, *format, options.seed,
      absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace mneme::cli
