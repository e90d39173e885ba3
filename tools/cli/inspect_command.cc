#include "tools/cli/inspect_command.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "engram_store/engram_checkpoint.h"
#include "tools/cli/args.h"

namespace mneme::cli {
namespace {

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B")
                   : absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

absl::Status RunInspect(const std::vector<std::string>& argv,
                        std::ostream& out) {
  ASSIGN_OR_RETURN(Args args, Args::Parse(argv, {}));
  if (args.positionals().size() != 1) {
    return absl::InvalidArgumentError("usage: mneme inspect DIR");
  }
  const std::string& dir = args.positionals()[0];
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ModelConfig> model,
                   checkpoint::ModelConfig::Create(
                       absl::StrCat(dir, "/", checkpoint::kConfigFileName)));
  ASSIGN_OR_RETURN(std::unique_ptr<engram::EngramCheckpoint> checkpoint,
                   engram::EngramCheckpoint::Open(dir));
  const engram::EngramCheckpoint& c = *checkpoint;

  out << "checkpoint " << dir << "\n";
  out << "model\n";
  for (const char* key : {"model_type", "vocab_size", "hidden_size",
                          "num_hidden_layers", "hc_mult"}) {
    const nlohmann::json* value = model->Find(key);
    if (value != nullptr)
      out << absl::StrFormat("  %-20s %s\n", key, value->dump());
  }

  out << "shards\n";
  uint64_t total = 0;
  for (const auto& shard : c.checkpoint().shards()) {
    total += shard->file_size();
    out << absl::StrFormat(
        "  %-40s %10s  %d tensors\n", BaseName(shard->path()),
        HumanBytes(shard->file_size()), shard->tensors().size());
  }
  out << absl::StrFormat("  %-40s %10s\n", "total", HumanBytes(total));

  out << "tensors\n";
  for (const auto& [name, location] : c.checkpoint().tensors()) {
    out << absl::StrFormat("  %-36s %-8s %-16s %s\n", name,
                           checkpoint::DTypeName(location.info->dtype),
                           ShapeText(location.info->shape),
                           BaseName(location.shard->path()));
  }

  const checkpoint::EngramConfig& e = c.config();
  out << "engram\n";
  out << absl::StrFormat("  %-28s [%s]\n", "layers",
                         absl::StrJoin(e.layer_ids, ", "));
  out << absl::StrFormat("  %-28s %s\n", "format",
                         formats::RowFormatName(e.format));
  out << absl::StrFormat("  %-28s %d x %d hash heads (%d columns)\n",
                         "n-gram orders 2..", e.max_ngram_size, e.n_heads,
                         e.NumColumns());
  out << absl::StrFormat("  %-28s %d\n", "values per row", e.head_dim);
  out << absl::StrFormat("  %-28s %d\n", "prime search start", e.vocab_size);
  out << absl::StrFormat("  %-28s %d (tokenizer agrees)\n",
                         "compressed vocabulary", e.compressed_vocab_size);
  out << absl::StrFormat("  %-28s %d\n", "pad token", e.pad_token_id);
  for (const checkpoint::EngramTableLocation& t : c.tables()) {
    const uint64_t row_bytes = t.weight_row_bytes + t.scale_row_bytes;
    out << absl::StrFormat(
        "  table layer %-3d %12d rows x %d B = %s in %s", t.layer, t.rows,
        row_bytes, HumanBytes(row_bytes * t.rows), BaseName(t.shard_path));
    if (t.format == formats::RowFormat::kNvfp4) {
      out << absl::StrFormat(", global scale %.9g", t.global_scale);
    }
    out << "\n";
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
