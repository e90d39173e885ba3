#include "tools/cli/make_checkpoint_command.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "tools/cli/args.h"
#include "tools/synthetic/release_checkpoint.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::cli {
namespace {

// An int flag in [min, max] into `field` (left as is when absent).
absl::Status SetInt(const Args& args, const std::string& name, int64_t min,
                    int64_t max, int& field) {
  ASSIGN_OR_RETURN(int64_t value, args.GetInt(name, field, min, max));
  field = static_cast<int>(value);
  return absl::OkStatus();
}

// A comma list of ints, each in [min, max], into `field` (left as is when
// absent).
absl::Status SetIntList(const Args& args, const std::string& name, int64_t min,
                        int64_t max, std::vector<int>& field) {
  if (!args.Has(name)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> values, args.GetIntList(name));
  field.clear();
  for (int64_t v : values) {
    if (v < min || v > max) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, ": ", v, " out of range [", min, ", ", max, "]"));
    }
    field.push_back(static_cast<int>(v));
  }
  return absl::OkStatus();
}

// Flags that shape the Engram-only checkpoint: not with --model (the
// released layouts have fixed dimensions).
constexpr const char* kNotWithModelFlags[] = {
    "wkv",           "expert-layers", "draft-stages",
    "experts",       "hidden-size",   "layers",
    "engram-layers", "hc-mult",       "moe-intermediate-size"};

// `make-checkpoint --model [--arch A] [--full-shapes]`: the released
// layouts (V4.1-Flash unless --arch says otherwise).
absl::Status RunReleaseLayout(const Args& args, std::ostream& out) {
  for (const char* flag : kNotWithModelFlags) {
    if (args.Has(flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag,
          " cannot be combined with --model (the released layouts have fixed "
          "dimensions; only --arch, --out, --seed, --engram-vocab-size, "
          "--engram-format, --threads, --full-shapes, --aligned-draft and "
          "--experts-format apply)"));
    }
  }
  synthetic::ReleaseCheckpointOptions options;
  ASSIGN_OR_RETURN(options.out_dir, args.Required("out"));
  ASSIGN_OR_RETURN(options.arch,
                   synthetic::ParseReleaseArch(args.Get("arch", "v4.1-flash")));
  ASSIGN_OR_RETURN(std::string format,
                   args.GetChoice("engram-format", "fp8", {"fp8", "nvfp4"}));
  options.engram_format =
      format == "fp8" ? formats::RowFormat::kFp8 : formats::RowFormat::kNvfp4;
  options.full_shapes = args.Has("full-shapes");
  options.aligned_draft = args.Has("aligned-draft");
  ASSIGN_OR_RETURN(
      options.experts_format,
      synthetic::ParseExpertsFormat(args.Get("experts-format", "mxfp4")));
  ASSIGN_OR_RETURN(
      int64_t seed,
      args.GetInt("seed", 0, 0, std::numeric_limits<int64_t>::max()));
  options.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(options.engram_vocab_size,
                   args.GetInt("engram-vocab-size", options.engram_vocab_size,
                               100, (int64_t{1} << 31) - 1));
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0, 0, 1024));
  options.threads = static_cast<int>(threads);
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(synthetic::MakeReleaseCheckpoint(options));
  out << absl::StrFormat(
      "wrote %s: %s %s checkpoint of the released layout%s%s, seed %d, "
      "%.1f s\n",
      options.out_dir, options.full_shapes ? "full-shape (sparse)" : "tiny",
      synthetic::ReleaseArchName(options.arch),
      options.aligned_draft ? " (aligned draft)" : "",
      options.experts_format == synthetic::ExpertsFormat::kExl3
          ? " with EXL3 experts"
      : options.experts_format == synthetic::ExpertsFormat::kGridbook
          ? " with GridBook experts"
          : "",
      options.seed, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMakeCheckpoint(const std::vector<std::string>& argv,
                               std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv,
                  {"out", "engram-format", "seed", "engram-vocab-size",
                   "threads", "wkv", "expert-layers", "draft-stages", "experts",
                   "hidden-size", "layers", "engram-layers", "hc-mult",
                   "moe-intermediate-size", "arch", "experts-format"},
                  {"model", "full-shapes", "aligned-draft"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        "make-checkpoint takes no positional arguments");
  }
  const bool model = args.Has("model");
  for (const char* flag :
       {"arch", "full-shapes", "aligned-draft", "experts-format"}) {
    if (args.Has(flag) && !model) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " requires --model"));
    }
  }
  if (model) return RunReleaseLayout(args, out);
  synthetic::SyntheticCheckpointOptions options;
  ASSIGN_OR_RETURN(std::string out_dir, args.Required("out"));
  options.out_dir = out_dir;
  ASSIGN_OR_RETURN(std::string format,
                   args.GetChoice("engram-format", "fp8", {"fp8", "nvfp4"}));
  options.engram_format =
      format == "fp8" ? formats::RowFormat::kFp8 : formats::RowFormat::kNvfp4;
  ASSIGN_OR_RETURN(
      int64_t seed,
      args.GetInt("seed", 0, 0, std::numeric_limits<int64_t>::max()));
  options.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(int64_t vocab,
                   args.GetInt("engram-vocab-size", options.engram_vocab_size,
                               100, (int64_t{1} << 31) - 1));
  options.engram_vocab_size = vocab;
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0, 0, 1024));
  options.threads = static_cast<int>(threads);

  ASSIGN_OR_RETURN(
      std::string wkv,
      args.GetChoice("wkv", "independent", {"independent", "correlated"}));
  options.wkv_kind = wkv == "correlated" ? synthetic::WkvKind::kCorrelated
                                         : synthetic::WkvKind::kIndependent;
  RETURN_IF_ERROR(
      SetIntList(args, "expert-layers", 0, 1024, options.expert_layer_ids));
  ASSIGN_OR_RETURN(int64_t draft, args.GetInt("draft-stages", 0, 0, 8));
  options.draft_stages = static_cast<int>(draft);
  // Dimensions; the library validates how they fit together.
  for (const auto& [flag, field] :
       std::initializer_list<std::pair<const char*, int*>>{
           {"experts", &options.num_routed_experts},
           {"hidden-size", &options.hidden_size},
           {"layers", &options.num_hidden_layers},
           {"hc-mult", &options.hc_mult},
           {"moe-intermediate-size", &options.moe_intermediate_size}}) {
    RETURN_IF_ERROR(SetInt(args, flag, 1, 1 << 16, *field));
  }
  RETURN_IF_ERROR(
      SetIntList(args, "engram-layers", 0, 1 << 16, options.engram_layer_ids));

  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(synthetic::MakeSyntheticCheckpoint(options));
  out << absl::StrFormat(
      "wrote %s: synthetic checkpoint, %s Engram tables, "
      "seed %d, %.1f s\n",
      options.out_dir, format, options.seed,
      absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace mneme::cli
