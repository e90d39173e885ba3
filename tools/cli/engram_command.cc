#include "tools/cli/engram_command.h"

#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_decode.h"
#include "nlohmann/json.hpp"
#include "tools/cli/args.h"

namespace mneme::cli {
namespace {

using engram::EngramCheckpoint;

absl::StatusOr<std::unique_ptr<EngramCheckpoint>> OpenCheckpoint(
    const Args& args) {
  absl::StatusOr<std::string> dir = args.Required("checkpoint");
  if (!dir.ok()) return dir.status();
  return EngramCheckpoint::Open(*dir);
}

absl::StatusOr<int> LayerArg(const Args& args) {
  if (!args.Has("layer")) {
    return absl::InvalidArgumentError("--layer is required");
  }
  absl::StatusOr<int64_t> layer =
      args.GetInt("layer", 0, 0, std::numeric_limits<int>::max());
  if (!layer.ok()) return layer.status();
  return static_cast<int>(*layer);
}

absl::Status Describe(const Args& args, std::ostream& out) {
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> c = OpenCheckpoint(args);
  if (!c.ok()) return c.status();
  const checkpoint::EngramConfig& config = (*c)->config();
  const engram::HashLayout& layout = (*c)->hasher().layout();
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const engram::LayerHashLayout& l : layout.layers()) {
    absl::StatusOr<const checkpoint::EngramTableLocation*> table =
        (*c)->Table(l.layer_id);
    if (!table.ok()) return table.status();
    layers.push_back({
        {"layer", l.layer_id},
        {"rows", (*table)->rows},
        {"format", formats::RowFormatName((*table)->format)},
        {"global_scale", (*table)->global_scale},
        {"compressed_vocab_size", config.compressed_vocab_size},
        {"multipliers", l.multipliers},
        {"primes", l.primes},
        {"offsets", l.offsets},
    });
  }
  const nlohmann::ordered_json json = {
      {"checkpoint", (*c)->dir()},
      {"format", formats::RowFormatName(config.format)},
      {"compressed_vocab_size", config.compressed_vocab_size},
      {"pad_token_id", config.pad_token_id},
      {"max_ngram_size", config.max_ngram_size},
      {"n_heads", config.n_heads},
      {"head_dim", config.head_dim},
      {"num_columns", config.NumColumns()},
      {"layers", layers},
  };
  out << json.dump(2) << "\n";
  return absl::OkStatus();
}

absl::Status Ids(const Args& args, std::ostream& out) {
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> c = OpenCheckpoint(args);
  if (!c.ok()) return c.status();
  absl::StatusOr<int> layer = LayerArg(args);
  if (!layer.ok()) return layer.status();
  absl::StatusOr<std::vector<int64_t>> tokens = args.GetIntList("tokens");
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::vector<int64_t>> ids =
      (*c)->hasher().RowIds(*layer, {}, *tokens);
  if (!ids.ok()) return ids.status();
  const size_t columns = (*c)->hasher().num_columns();
  for (size_t t = 0; t < tokens->size(); ++t) {
    out << absl::StrJoin(ids->begin() + t * columns,
                         ids->begin() + (t + 1) * columns, " ")
        << "\n";
  }
  return absl::OkStatus();
}

absl::Status Rows(const Args& args, std::ostream& out) {
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> c = OpenCheckpoint(args);
  if (!c.ok()) return c.status();
  absl::StatusOr<int> layer = LayerArg(args);
  if (!layer.ok()) return layer.status();
  absl::StatusOr<std::vector<int64_t>> ids = args.GetIntList("ids");
  if (!ids.ok()) return ids.status();
  absl::StatusOr<const checkpoint::EngramTableLocation*> table =
      (*c)->Table(*layer);
  if (!table.ok()) return table.status();
  const size_t row_bytes = formats::RowBytes((*table)->format);
  std::vector<uint8_t> raw(ids->size() * row_bytes);
  if (absl::Status s = (*c)->ReadRawRows(*layer, *ids, absl::MakeSpan(raw));
      !s.ok()) {
    return s;
  }
  std::vector<float> values(ids->size() * formats::kRowDim);
  if (absl::Status s = formats::DecodeRowsF32(
          {.format = (*table)->format, .global_scale = (*table)->global_scale},
          raw, absl::MakeSpan(values));
      !s.ok()) {
    return s;
  }
  char buf[32];
  for (size_t r = 0; r < ids->size(); ++r) {
    std::string line;
    for (int i = 0; i < formats::kRowDim; ++i) {
      std::snprintf(buf, sizeof(buf), "%.9g",
                    static_cast<double>(values[r * formats::kRowDim + i]));
      if (i > 0) line += ' ';
      line += buf;
    }
    out << line << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunEngramOffline(const std::vector<std::string>& argv,
                              std::ostream& out) {
  if (argv.empty()) {
    return absl::InvalidArgumentError(
        "usage: mneme engram describe|ids|rows --checkpoint DIR ...");
  }
  const std::string& command = argv[0];
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  absl::StatusOr<Args> args = Args::Parse(
      rest, command == "describe" ? std::set<std::string>{"checkpoint"}
            : command == "ids"
                ? std::set<std::string>{"checkpoint", "layer", "tokens"}
                : std::set<std::string>{"checkpoint", "layer", "ids"});
  if (!args.ok()) return args.status();
  if (!args->positionals().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args->positionals()[0], "'"));
  }
  if (command == "describe") return Describe(*args, out);
  if (command == "ids") return Ids(*args, out);
  if (command == "rows") return Rows(*args, out);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown engram command '", command, "' (describe|ids|rows)"));
}

}  // namespace mneme::cli
