#include "tools/cli/inspect_command.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/gridbook_artifact.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/status_macros.h"
#include "engram_store/engram_checkpoint.h"
#include "model/model_config.h"
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

std::string LayerList(const std::vector<int>& layers) {
  return layers.empty() ? std::string("none")
                        : absl::StrCat("[", absl::StrJoin(layers, ", "), "]");
}

// The format of the routed experts, from the first expert's w1 tensors.
std::string ExpertFormat(const checkpoint::ShardedCheckpoint& ckpt) {
  std::string prefix;
  for (const auto& [name, location] : ckpt.tensors()) {
    const size_t at = name.find(".ffn.experts.");
    if (at != std::string::npos && absl::EndsWith(name, ".w1.weight")) {
      prefix = name.substr(0, name.size() - std::string("weight").size());
      break;
    }
  }
  if (prefix.empty()) return "none (no routed experts)";
  const checkpoint::TensorLocation* w = ckpt.FindOrNull(prefix + "weight");
  using checkpoint::DType;
  const DType dt = w->info->dtype;
  if (dt == DType::kU8 || dt == DType::kI8) {
    if (ckpt.FindOrNull(prefix + "weight_scale") != nullptr) {
      return "NVFP4 (e2m1, E4M3 scale per 16 + fp32 global scale)";
    }
    return "MXFP4 (e2m1, E8M0 scale per 32)";
  }
  if (dt == DType::kF8E4M3) return "FP8 (e4m3, block scales)";
  return std::string(checkpoint::DTypeName(dt));
}

// The linear modules per storage format, like a quantized artifact's
// allocation map: EXL3 (by bits and codebook), GridBook (by config group
// format; stacked experts counted one module per expert and projection),
// and the release's formats (FP8 block, MXFP4, NVFP4, BF16 / F32 matrices).
void PrintModuleFormats(const checkpoint::ShardedCheckpoint& ckpt,
                        const checkpoint::GridbookArtifact* gridbook,
                        std::ostream& out) {
  struct Count {
    int64_t modules = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Count> formats;
  auto bytes_of = [&](const std::string& name) -> uint64_t {
    const checkpoint::TensorLocation* t = ckpt.FindOrNull(name);
    return t == nullptr ? 0 : t->info->byte_length;
  };
  for (const auto& [name, location] : ckpt.tensors()) {
    const std::vector<int64_t>& shape = location.info->shape;
    if (absl::EndsWith(name, ".trellis") && shape.size() == 3) {
      const std::string m = name.substr(0, name.size() - 8);
      const char* codebook = ckpt.FindOrNull(m + ".mcg") != nullptr ? "mcg"
                             : ckpt.FindOrNull(m + ".mul1") != nullptr
                                 ? "mul1"
                                 : "3inst";
      Count& c = formats[absl::StrCat("EXL3 K", shape[2] / 16, " ", codebook)];
      ++c.modules;
      c.bytes += location.info->byte_length;
      for (const char* s : {".suh", ".svh", ".su", ".sv"}) {
        c.bytes += bytes_of(m + s);
      }
      continue;
    }
    if (absl::EndsWith(name, ".cb_qweight")) {
      const std::string t = name.substr(0, name.size() - 11);
      std::string format = "GridBook (no config group)";
      int64_t modules = 1;
      if (gridbook != nullptr) {
        // Stacked experts: the first expert's module names the group.
        const bool stacked = shape.size() == 3;
        std::string module = t;
        if (stacked) {
          const std::string experts = t.substr(0, t.rfind('.'));
          module = absl::StrCat(experts, ".0.",
                                absl::EndsWith(t, ".down_proj") ? "w2" : "w1");
          modules = shape[0] * (absl::EndsWith(t, ".gate_up_proj") ? 2 : 1);
        }
        if (const auto p = gridbook->Find(module)) {
          format = absl::StrCat("GridBook ", p->group->format,
                                p->group->w4a4 ? " (W4A4)" : "");
        }
      }
      Count& c = formats[format];
      c.modules += modules;
      c.bytes += location.info->byte_length + bytes_of(t + ".weight_scale");
      continue;
    }
    if (!absl::EndsWith(name, ".weight") || shape.size() != 2) continue;
    const std::string m = name.substr(0, name.size() - 7);
    using checkpoint::DType;
    const DType dt = location.info->dtype;
    std::string format;
    uint64_t bytes = location.info->byte_length;
    if (dt == DType::kF8E4M3) {
      format = "FP8 block";
      bytes += bytes_of(m + ".scale");
    } else if (dt == DType::kU8 || dt == DType::kI8) {
      const bool nvfp4 = ckpt.FindOrNull(m + ".weight_scale") != nullptr;
      format = nvfp4 ? "NVFP4" : "MXFP4";
      bytes += bytes_of(m + (nvfp4 ? ".weight_scale" : ".scale"));
    } else {
      format = std::string(checkpoint::DTypeName(dt));
    }
    if (gridbook != nullptr) {
      // A unit names a module or the experts holding it.
      for (const auto& [unit, wire] : gridbook->passthrough()) {
        if (m == unit || absl::StartsWith(m, unit + ".")) {
          format += " (source passthrough)";
          break;
        }
      }
    }
    Count& c = formats[format];
    ++c.modules;
    c.bytes += bytes;
  }
  out << "module formats\n";
  for (const auto& [format, c] : formats) {
    out << absl::StrFormat("  %-36s %6d modules  %10s\n", format, c.modules,
                           HumanBytes(c.bytes));
  }
}

// What the config and the tensor names say about the architecture.
void PrintArchitecture(const checkpoint::ModelConfig& config,
                       const checkpoint::ShardedCheckpoint& ckpt,
                       std::ostream& out) {
  absl::StatusOr<model::ModelDims> dims = model::LoadModelDims(config);
  out << "architecture\n";
  if (!dims.ok()) {
    out << "  not a released architecture: " << dims.status().message() << "\n";
    return;
  }
  const model::ModelDims& d = *dims;
  std::string name = d.IsV41() ? "DeepSeek-V4.1-Flash (deepseek_v41)"
                               : "DeepSeek-V4-Flash (deepseek_v4)";
  if (!d.IsV41() && d.dspark_block_size > 0) name += " with DSpark stages";
  out << absl::StrFormat("  %-28s %s\n", "model", name);
  out << absl::StrFormat("  %-28s %d\n", "main layers", d.num_layers);
  std::vector<int> window, sources, readers, indexers, hashed;
  std::map<int, std::vector<int>> by_ratio;
  for (int l = 0; l < d.num_layers; ++l) {
    const int r = d.compress_ratios[l];
    if (d.CacheSource(l) < 0) {
      window.push_back(l);
    } else {
      by_ratio[r].push_back(l);
    }
    if (d.IsV41() && d.HasCompressor(l)) sources.push_back(l);
    if (d.IsV41() && !d.HasCompressor(l) && d.CacheSource(l) >= 0) {
      readers.push_back(l);
    }
    if (d.HasIndexer(l)) indexers.push_back(l);
    if (!d.IsV41() && l < d.num_hash_layers) hashed.push_back(l);
  }
  out << absl::StrFormat("  %-28s %s\n", "window-only", LayerList(window));
  for (const auto& [ratio, layers] : by_ratio) {
    out << absl::StrFormat("  %-28s %s\n",
                           absl::StrCat("compressed ratio ", ratio),
                           LayerList(layers));
  }
  if (d.IsV41()) {
    out << absl::StrFormat("  %-28s %s\n", "kv source", LayerList(sources));
    out << absl::StrFormat("  %-28s %s\n", "reads a kv source",
                           LayerList(readers));
    out << absl::StrFormat("  %-28s %s\n", "index source", LayerList(indexers));
    out << absl::StrFormat(
        "  %-28s %s\n", "candidate source",
        d.candidate_source_layer < 0
            ? std::string("none")
            : absl::StrFormat("%d (%d blocks of %d)", d.candidate_source_layer,
                              d.candidate_topk_blocks, d.candidate_block_size));
  } else {
    out << absl::StrFormat("  %-28s %s\n", "indexer", LayerList(indexers));
  }
  out << absl::StrFormat("  %-28s %s\n", "hash-routed", LayerList(hashed));
  out << absl::StrFormat(
      "  %-28s %d (%s)\n", "draft stages", d.num_draft_layers,
      d.dspark_block_size > 0
          ? absl::StrFormat("DSpark, block %d, target layers %s",
                            d.dspark_block_size,
                            LayerList(d.dspark_target_layers))
          : std::string(d.num_draft_layers > 0 ? "MTP" : "none"));
  out << absl::StrFormat("  %-28s %s\n", "Engram layers",
                         LayerList(d.engram_layers));
  int64_t image = 0;
  for (const auto& [tensor, location] : ckpt.tensors()) {
    if (absl::StartsWith(tensor, "vision.") ||
        absl::StartsWith(tensor, "aligner.") ||
        absl::StartsWith(tensor, "image_")) {
      ++image;
    }
  }
  out << absl::StrFormat("  %-28s %d\n", "image tensors", image);
  out << absl::StrFormat("  %-28s %s\n", "expert format", ExpertFormat(ckpt));
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
  // The Engram section needs the Engram configuration; a checkpoint
  // without Engram layers (V4-Flash) has none.
  // An Engram configuration that does not open (e.g. a tokenizer that
  // disagrees with it) is reported after everything else is printed.
  std::unique_ptr<engram::EngramCheckpoint> engram_checkpoint;
  absl::Status engram_status;
  std::unique_ptr<checkpoint::ShardedCheckpoint> own_checkpoint;
  const checkpoint::ShardedCheckpoint* tensors = nullptr;
  if (model->Find("engram_layer_ids") != nullptr) {
    absl::StatusOr<std::unique_ptr<engram::EngramCheckpoint>> opened =
        engram::EngramCheckpoint::Open(dir);
    if (opened.ok()) {
      engram_checkpoint = *std::move(opened);
      tensors = &engram_checkpoint->checkpoint();
    } else {
      engram_status = opened.status();
    }
  }
  if (tensors == nullptr) {
    ASSIGN_OR_RETURN(own_checkpoint,
                     checkpoint::ShardedCheckpoint::Create(dir));
    tensors = own_checkpoint.get();
  }

  out << "checkpoint " << dir << "\n";
  out << "model\n";
  for (const char* key : {"model_type", "vocab_size", "hidden_size",
                          "num_hidden_layers", "hc_mult"}) {
    const nlohmann::json* value = model->Find(key);
    if (value != nullptr)
      out << absl::StrFormat("  %-20s %s\n", key, value->dump());
  }

  PrintArchitecture(*model, *tensors, out);
  absl::StatusOr<std::unique_ptr<checkpoint::GridbookArtifact>> gridbook =
      checkpoint::GridbookArtifact::Open(dir);
  PrintModuleFormats(*tensors, gridbook.ok() ? gridbook->get() : nullptr, out);
  if (!gridbook.ok()) {
    out << "  the GridBook artifact does not open: "
        << gridbook.status().message() << "\n";
  }

  out << "shards\n";
  uint64_t total = 0;
  for (const auto& shard : tensors->shards()) {
    total += shard->file_size();
    out << absl::StrFormat(
        "  %-40s %10s  %d tensors\n", BaseName(shard->path()),
        HumanBytes(shard->file_size()), shard->tensors().size());
  }
  out << absl::StrFormat("  %-40s %10s\n", "total", HumanBytes(total));

  out << "tensors\n";
  for (const auto& [name, location] : tensors->tensors()) {
    out << absl::StrFormat("  %-36s %-8s %-16s %s\n", name,
                           checkpoint::DTypeName(location.info->dtype),
                           ShapeText(location.info->shape),
                           BaseName(location.shard->path()));
  }

  if (!engram_status.ok()) {
    out << "engram\n  not readable: " << engram_status.message() << "\n";
    return engram_status;
  }
  if (engram_checkpoint == nullptr) {
    out << "engram\n  none\n";
    return absl::OkStatus();
  }
  const engram::EngramCheckpoint& c = *engram_checkpoint;
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
