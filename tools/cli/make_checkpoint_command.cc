#include "tools/cli/make_checkpoint_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/cli/args.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::cli {

absl::Status RunMakeCheckpoint(const std::vector<std::string>& argv,
                               std::ostream& out) {
  absl::StatusOr<Args> args = Args::Parse(
      argv, {"out", "engram-format", "seed", "engram-vocab-size", "threads",
             "wkv", "expert-layers", "draft-stages", "experts"});
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

  absl::StatusOr<std::string> wkv =
      args->GetChoice("wkv", "independent", {"independent", "correlated"});
  if (!wkv.ok()) return wkv.status();
  options.wkv_kind = *wkv == "correlated" ? synthetic::WkvKind::kCorrelated
                                          : synthetic::WkvKind::kIndependent;
  if (args->Has("expert-layers")) {
    absl::StatusOr<std::vector<int64_t>> layers =
        args->GetIntList("expert-layers");
    if (!layers.ok()) return layers.status();
    for (int64_t layer : *layers) {
      if (layer < 0 || layer > 1024) {
        return absl::InvalidArgumentError(
            absl::StrCat("--expert-layers: layer ", layer, " out of range"));
      }
      options.expert_layer_ids.push_back(static_cast<int>(layer));
    }
  }
  absl::StatusOr<int64_t> draft = args->GetInt("draft-stages", 0, 0, 8);
  if (!draft.ok()) return draft.status();
  options.draft_stages = static_cast<int>(*draft);
  absl::StatusOr<int64_t> experts =
      args->GetInt("experts", options.num_routed_experts, 1, 1024);
  if (!experts.ok()) return experts.status();
  options.num_routed_experts = static_cast<int>(*experts);

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
