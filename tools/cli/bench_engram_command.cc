#include "tools/cli/bench_engram_command.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engram_store/engram_store.h"
#include "nlohmann/json.hpp"
#include "tools/cli/args.h"
#include "tools/cli/percentile.h"

namespace mneme::cli {
namespace {

using engram::EngramStore;

// Token ids drawn from a Zipf(s) law over a random permutation of the
// vocabulary: a few tokens are frequent, most are rare, as in text.
class ZipfTokenStream {
 public:
  ZipfTokenStream(int64_t vocab_size, double exponent, uint64_t seed)
      : rng_(seed), tokens_(vocab_size), cdf_(vocab_size) {
    std::iota(tokens_.begin(), tokens_.end(), 0);
    std::shuffle(tokens_.begin(), tokens_.end(), rng_);
    double sum = 0;
    for (int64_t r = 0; r < vocab_size; ++r) {
      sum += 1.0 / std::pow(static_cast<double>(r + 1), exponent);
      cdf_[r] = sum;
    }
    for (double& c : cdf_) c /= sum;
  }

  int64_t Next() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    return tokens_[std::min<size_t>(it - cdf_.begin(), tokens_.size() - 1)];
  }

 private:
  std::mt19937_64 rng_;
  std::vector<int64_t> tokens_;
  std::vector<double> cdf_;
};

}  // namespace

absl::Status RunBenchEngram(const std::vector<std::string>& argv,
                            std::ostream& out) {
  if (argv.empty() || argv[0] != "engram") {
    return absl::InvalidArgumentError("usage: mneme bench engram ...");
  }
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(std::vector<std::string>(argv.begin() + 1, argv.end()),
                  {"checkpoint", "layer", "io", "threads", "tokens-per-step",
                   "steps", "ram-cache-bytes", "seed", "local-copy"},
                  {"direct", "json"}));
  engram::EngramStoreOptions options;
  ASSIGN_OR_RETURN(std::string checkpoint, args.Required("checkpoint"));
  options.checkpoint_dir = checkpoint;
  ASSIGN_OR_RETURN(std::string io,
                   args.GetChoice("io", "pread", {"pread", "uring"}));
  options.io_backend =
      io == "uring" ? engram::IoBackend::kUring : engram::IoBackend::kPread;
  options.source_open_mode = args.Has("direct") ? engram::OpenMode::kDirect
                                                : engram::OpenMode::kBuffered;
  absl::StatusOr<int64_t> threads = args.GetInt("threads", 16, 1, 1024);
  absl::StatusOr<int64_t> tokens =
      args.GetInt("tokens-per-step", 48, 1, 1 << 20);
  absl::StatusOr<int64_t> steps = args.GetInt("steps", 100, 1, 1 << 24);
  absl::StatusOr<int64_t> cache =
      args.GetInt("ram-cache-bytes", 0, 0, std::numeric_limits<int64_t>::max());
  absl::StatusOr<int64_t> seed =
      args.GetInt("seed", 1, 0, std::numeric_limits<int64_t>::max());
  absl::StatusOr<int64_t> layer =
      args.GetInt("layer", -1, 0, std::numeric_limits<int>::max());
  for (const absl::Status& s :
       {threads.status(), tokens.status(), steps.status(), cache.status(),
        seed.status(), layer.status()}) {
    if (!s.ok()) return s;
  }
  if (!args.Has("layer")) {
    return absl::InvalidArgumentError("--layer is required");
  }
  options.io_threads = static_cast<int>(*threads);
  options.ram_cache_bytes = static_cast<uint64_t>(*cache);
  options.prefetch_threads = 0;
  // A local copy made by `mneme localize --tp 1 --rank 0` (the whole table,
  // rows packed weight || scale: one page per row under O_DIRECT).
  options.local_copy_dir = args.Get("local-copy", "");
  options.local_open_mode = options.source_open_mode;

  ASSIGN_OR_RETURN(std::unique_ptr<EngramStore> store,
                   EngramStore::Create(options));
  const engram::NgramHasher& hasher = store->checkpoint().hasher();
  const int layer_id = static_cast<int>(*layer);
  if (absl::StatusOr<const checkpoint::EngramTableLocation*> t =
          store->checkpoint().Table(layer_id);
      !t.ok()) {
    return t.status();
  }
  ZipfTokenStream stream(hasher.vocabulary().num_tokens(), 1.1,
                         static_cast<uint64_t>(*seed));
  const int columns = hasher.num_columns();
  std::vector<int64_t> history;
  std::vector<double> step_seconds;
  uint64_t rows_total = 0;
  std::vector<uint8_t> output;
  const absl::Time start = absl::Now();
  for (int64_t step = 0; step < *steps; ++step) {
    std::vector<int64_t> step_tokens(*tokens);
    for (int64_t& t : step_tokens) t = stream.Next();
    const absl::Time step_start = absl::Now();
    const size_t context =
        std::min<size_t>(history.size(), hasher.context_size());
    ASSIGN_OR_RETURN(
        std::vector<int64_t> ids,
        hasher.RowIds(layer_id,
                      absl::MakeConstSpan(
                          history.data() + history.size() - context, context),
                      step_tokens));
    output.resize(ids.size() * formats::kRowDim * sizeof(uint16_t));
    RETURN_IF_ERROR(store->Lookup(layer_id, ids, engram::RowEncoding::kBf16,
                                  absl::MakeSpan(output),
                                  absl::Now() + absl::Seconds(60)));
    step_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - step_start));
    rows_total += ids.size();
    history.insert(history.end(), step_tokens.begin(), step_tokens.end());
    if (history.size() > 64) history.erase(history.begin(), history.end() - 8);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const engram::EngramStoreStats stats = store->GetStats();
  const uint64_t raw_row_bytes =
      formats::RowBytes(store->checkpoint().config().format);
  nlohmann::ordered_json result = {
      {"checkpoint", options.checkpoint_dir},
      {"layer", layer_id},
      {"format", formats::RowFormatName(store->checkpoint().config().format)},
      {"io", io},
      {"direct", args.Has("direct")},
      {"threads", *threads},
      {"tokens_per_step", *tokens},
      {"steps", *steps},
      {"columns", columns},
      {"rows", rows_total},
      {"unique_rows", stats.rows_unique},
      {"rows_read_from_disk", stats.source_rows + stats.local_rows},
      {"rows_read_from_local_copy", stats.local_rows},
      {"ram_cache_hits", stats.ram_hits},
      {"seconds", seconds},
      {"rows_per_second", rows_total / seconds},
      {"disk_bytes_per_second",
       static_cast<double>((stats.source_rows + stats.local_rows) *
                           raw_row_bytes) /
           seconds},
      {"step_p50_ms", Percentile(step_seconds, 50) * 1e3},
      {"step_p99_ms", Percentile(step_seconds, 99) * 1e3},
      {"step_max_ms", Percentile(step_seconds, 100) * 1e3},
  };
  if (args.Has("json")) {
    out << result.dump() << "\n";
  } else {
    for (const auto& [key, value] : result.items()) {
      out << absl::StrFormat("%-22s %s\n", key, value.dump());
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
