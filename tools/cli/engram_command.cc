#include "tools/cli/engram_command.h"

#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_decode.h"
#include "nlohmann/json.hpp"
#include "tools/cli/args.h"

namespace mneme::cli {
namespace {

using engram::EngramCheckpoint;

absl::StatusOr<std::unique_ptr<EngramCheckpoint>> OpenCheckpoint(
    const Args& args) {
  ASSIGN_OR_RETURN(std::string dir, args.Required("checkpoint"));
  return EngramCheckpoint::Open(dir);
}

absl::StatusOr<int> LayerArg(const Args& args) {
  if (!args.Has("layer")) {
    return absl::InvalidArgumentError("--layer is required");
  }
  ASSIGN_OR_RETURN(int64_t layer,
                   args.GetInt("layer", 0, 0, std::numeric_limits<int>::max()));
  return static_cast<int>(layer);
}

absl::Status Describe(const Args& args, std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<EngramCheckpoint> c, OpenCheckpoint(args));
  const checkpoint::EngramConfig& config = c->config();
  const engram::HashLayout& layout = c->hasher().layout();
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const engram::LayerHashLayout& l : layout.layers()) {
    ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* table,
                     c->Table(l.layer_id));
    layers.push_back({
        {"layer", l.layer_id},
        {"rows", table->rows},
        {"format", formats::RowFormatName(table->format)},
        {"global_scale", table->global_scale},
        {"compressed_vocab_size", config.compressed_vocab_size},
        {"multipliers", l.multipliers},
        {"primes", l.primes},
        {"offsets", l.offsets},
    });
  }
  const nlohmann::ordered_json json = {
      {"checkpoint", c->dir()},
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
  ASSIGN_OR_RETURN(std::unique_ptr<EngramCheckpoint> c, OpenCheckpoint(args));
  ASSIGN_OR_RETURN(int layer, LayerArg(args));
  ASSIGN_OR_RETURN(std::vector<int64_t> tokens, args.GetIntList("tokens"));
  ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                   c->hasher().RowIds(layer, {}, tokens));
  const size_t columns = c->hasher().num_columns();
  for (size_t t = 0; t < tokens.size(); ++t) {
    out << absl::StrJoin(ids.begin() + t * columns,
                         ids.begin() + (t + 1) * columns, " ")
        << "\n";
  }
  return absl::OkStatus();
}

absl::Status Rows(const Args& args, std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<EngramCheckpoint> c, OpenCheckpoint(args));
  ASSIGN_OR_RETURN(int layer, LayerArg(args));
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, args.GetIntList("ids"));
  ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* table,
                   c->Table(layer));
  const size_t row_bytes = formats::RowBytes(table->format);
  std::vector<uint8_t> raw(ids.size() * row_bytes);
  RETURN_IF_ERROR(c->ReadRawRows(layer, ids, absl::MakeSpan(raw)));
  std::vector<float> values(ids.size() * formats::kRowDim);
  RETURN_IF_ERROR(formats::DecodeRowsF32(
      {.format = table->format, .global_scale = table->global_scale}, raw,
      absl::MakeSpan(values)));
  char buf[32];
  for (size_t r = 0; r < ids.size(); ++r) {
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
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(rest,
                  command == "describe" ? std::set<std::string>{"checkpoint"}
                  : command == "ids"
                      ? std::set<std::string>{"checkpoint", "layer", "tokens"}
                      : std::set<std::string>{"checkpoint", "layer", "ids"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args.positionals()[0], "'"));
  }
  if (command == "describe") return Describe(args, out);
  if (command == "ids") return Ids(args, out);
  if (command == "rows") return Rows(args, out);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown engram command '", command, "' (describe|ids|rows)"));
}

}  // namespace mneme::cli
