#include "engram_store/local_copy/local_copy_manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mneme::engram {
namespace {

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Bit equality: a recorded scale must be exactly the checkpoint's.
bool SameFloat(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

std::vector<RowRange> CoveredRanges(const LocalCopyLayer& layer) {
  std::vector<RowRange> ranges;
  ranges.reserve(layer.ranges.size());
  for (const LocalCopyRange& range : layer.ranges) {
    ranges.push_back(RowRange{range.first_row, range.end_row()});
  }
  return CoalesceRowRanges(ranges);
}

int64_t TotalRows(const std::vector<RowRange>& ranges) {
  int64_t total = 0;
  for (const RowRange& range : ranges) total += range.size();
  return total;
}

}  // namespace

std::string LocalCopyDataFileName(int layer) {
  return absl::StrCat("engram_layer_", layer, ".rows");
}

absl::StatusOr<SourceIdentity> IdentifySource(
    const EngramCheckpoint& checkpoint) {
  const checkpoint::EngramConfig& config = checkpoint.config();
  SourceIdentity source;
  source.layer_ids = config.layer_ids;
  source.num_embeddings = config.num_embeddings;
  source.max_ngram_size = config.max_ngram_size;
  source.n_heads = config.n_heads;
  source.head_dim = config.head_dim;
  source.vocab_size = config.vocab_size;
  source.format = config.format;
  if (config.format == formats::RowFormat::kNvfp4) {
    source.quant_block_size = config.quant_block_size;
    source.global_scales = config.global_scales;
  }
  std::set<std::string> paths;
  for (const checkpoint::EngramTableLocation& table : checkpoint.tables()) {
    paths.insert(table.shard_path);
    paths.insert(table.scale_shard_path);
  }
  for (const std::string& path : paths) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot stat checkpoint shard '", path, "'"));
    }
    source.shards.push_back(SourceShardIdentity{
        .file = BaseName(path),
        .size_bytes = static_cast<uint64_t>(st.st_size),
        .mtime_ns =
            int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec,
    });
  }
  std::sort(source.shards.begin(), source.shards.end(),
            [](const SourceShardIdentity& a, const SourceShardIdentity& b) {
              return a.file < b.file;
            });
  return source;
}

std::optional<std::string> DescribeSourceMismatch(
    const SourceIdentity& recorded, const SourceIdentity& current) {
  auto differ = [](absl::string_view key, const auto& then, const auto& now) {
    return absl::StrCat(key, ": ", then, " in the manifest, ", now, " now");
  };
  if (recorded.layer_ids != current.layer_ids) {
    return differ("engram_layer_ids", absl::StrJoin(recorded.layer_ids, ","),
                  absl::StrJoin(current.layer_ids, ","));
  }
  if (recorded.num_embeddings != current.num_embeddings) {
    return differ("engram_num_embeddings",
                  absl::StrJoin(recorded.num_embeddings, ","),
                  absl::StrJoin(current.num_embeddings, ","));
  }
  if (recorded.max_ngram_size != current.max_ngram_size) {
    return differ("engram_max_ngram_size", recorded.max_ngram_size,
                  current.max_ngram_size);
  }
  if (recorded.n_heads != current.n_heads) {
    return differ("engram_n_heads", recorded.n_heads, current.n_heads);
  }
  if (recorded.head_dim != current.head_dim) {
    return differ("engram_head_dim", recorded.head_dim, current.head_dim);
  }
  if (recorded.vocab_size != current.vocab_size) {
    return differ("engram_vocab_size", recorded.vocab_size, current.vocab_size);
  }
  if (recorded.format != current.format) {
    return differ("engram_quant", formats::RowFormatName(recorded.format),
                  formats::RowFormatName(current.format));
  }
  if (recorded.quant_block_size != current.quant_block_size) {
    return differ("engram_quant_block_size", recorded.quant_block_size,
                  current.quant_block_size);
  }
  const bool same_scales =
      recorded.global_scales.size() == current.global_scales.size() &&
      std::equal(recorded.global_scales.begin(), recorded.global_scales.end(),
                 current.global_scales.begin(),
                 [](const auto& a, const auto& b) {
                   return a.first == b.first && SameFloat(a.second, b.second);
                 });
  if (!same_scales) {
    auto format = [](const std::map<int, float>& scales) {
      return absl::StrJoin(scales, ",", [](std::string* out, const auto& kv) {
        absl::StrAppend(out, kv.first, "=", kv.second);
      });
    };
    return differ("engram_quant_global_scale", format(recorded.global_scales),
                  format(current.global_scales));
  }
  for (const SourceShardIdentity& then : recorded.shards) {
    auto now = std::find_if(
        current.shards.begin(), current.shards.end(),
        [&](const SourceShardIdentity& s) { return s.file == then.file; });
    if (now == current.shards.end()) {
      return absl::StrCat("shard ", then.file,
                          " is in the manifest but holds no Engram table now");
    }
    if (now->size_bytes != then.size_bytes) {
      return differ(absl::StrCat("shard ", then.file, " size (bytes)"),
                    then.size_bytes, now->size_bytes);
    }
    if (now->mtime_ns != then.mtime_ns) {
      return differ(absl::StrCat("shard ", then.file, " mtime (ns)"),
                    then.mtime_ns, now->mtime_ns);
    }
  }
  for (const SourceShardIdentity& now : current.shards) {
    auto then = std::find_if(
        recorded.shards.begin(), recorded.shards.end(),
        [&](const SourceShardIdentity& s) { return s.file == now.file; });
    if (then == recorded.shards.end()) {
      return absl::StrCat(
          "shard ", now.file,
          " holds Engram tables now but is not in the manifest");
    }
  }
  return std::nullopt;
}

std::string DescribeTarget(const LocalCopyTarget& target) {
  return absl::StrCat("tp ", target.tp_size,
                      target.ranks.size() == 1 ? ", rank " : ", ranks ",
                      absl::StrJoin(target.ranks, ","), ", ",
                      ColumnSplitName(target.split), " split");
}

absl::Status ValidateTarget(const LocalCopyTarget& target) {
  if (target.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_size must be >= 1, got ", target.tp_size));
  }
  if (target.ranks.empty()) {
    return absl::InvalidArgumentError("ranks: at least one rank is required");
  }
  for (size_t i = 0; i < target.ranks.size(); ++i) {
    const int rank = target.ranks[i];
    if (rank < 0 || rank >= target.tp_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks: rank ", rank, " is outside [0, ", target.tp_size, ")"));
    }
    if (i > 0 && rank <= target.ranks[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks: ", absl::StrJoin(target.ranks, ","),
                       " must be ascending and distinct"));
    }
  }
  if (target.split != ColumnSplit::kContiguous &&
      target.split != ColumnSplit::kStrided) {
    return absl::InvalidArgumentError(
        "split must be contiguous or strided, got unspecified");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<RowRange>>> TargetRowRanges(
    const HashLayout& layout, const LocalCopyTarget& target) {
  RETURN_IF_ERROR(ValidateTarget(target));
  std::vector<std::vector<RowRange>> per_layer(layout.layers().size());
  for (int rank : target.ranks) {
    ASSIGN_OR_RETURN(RankAssignment assignment,
                     AssignRank(layout, target.split, target.tp_size, rank));
    for (size_t i = 0; i < assignment.layers.size(); ++i) {
      const std::vector<RowRange>& rows = assignment.layers[i].column_rows;
      per_layer[i].insert(per_layer[i].end(), rows.begin(), rows.end());
    }
  }
  for (std::vector<RowRange>& ranges : per_layer) {
    ranges = CoalesceRowRanges(ranges);
  }
  return per_layer;
}

int64_t LocalCopyLayer::covered_rows() const {
  int64_t total = 0;
  for (const LocalCopyRange& range : ranges) total += range.count;
  return total;
}

uint64_t LocalCopyLayer::data_bytes() const {
  return static_cast<uint64_t>(covered_rows()) * row_bytes();
}

const LocalCopyLayer* LocalCopyManifest::FindLayer(int layer) const {
  for (const LocalCopyLayer& l : layers) {
    if (l.layer == layer) return &l;
  }
  return nullptr;
}

absl::StatusOr<LocalCopyManifest> PlanLocalCopy(
    const EngramCheckpoint& checkpoint, const SourceIdentity& source,
    const LocalCopyTarget& target, uint64_t max_range_bytes) {
  if (max_range_bytes == 0) {
    return absl::InvalidArgumentError("max_range_bytes must be > 0");
  }
  const HashLayout& layout = checkpoint.hasher().layout();
  ASSIGN_OR_RETURN(std::vector<std::vector<RowRange>> per_layer,
                   TargetRowRanges(layout, target));
  LocalCopyManifest manifest;
  manifest.source = source;
  manifest.target = target;
  for (size_t i = 0; i < layout.layers().size(); ++i) {
    const int layer_id = layout.layers()[i].layer_id;
    ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* table,
                     checkpoint.Table(layer_id));
    const checkpoint::EngramTableLocation& t = *table;
    LocalCopyLayer layer;
    layer.layer = layer_id;
    layer.format = t.format;
    layer.table_rows = t.rows;
    layer.weight_row_bytes = t.weight_row_bytes;
    layer.scale_row_bytes = t.scale_row_bytes;
    layer.global_scale = t.global_scale;
    layer.data_file = LocalCopyDataFileName(layer_id);
    const int64_t max_rows = static_cast<int64_t>(
        std::max<uint64_t>(1, max_range_bytes / layer.row_bytes()));
    uint64_t offset = 0;
    for (const RowRange& range : per_layer[i]) {
      if (range.end > t.rows) {
        return absl::InternalError(absl::StrCat(
            "layer ", layer_id, ": assigned rows [", range.begin, ", ",
            range.end, ") run past the table's ", t.rows, " rows"));
      }
      for (int64_t first = range.begin; first < range.end; first += max_rows) {
        const int64_t count = std::min(max_rows, range.end - first);
        layer.ranges.push_back(LocalCopyRange{
            .first_row = first, .count = count, .offset = offset});
        offset += static_cast<uint64_t>(count) * layer.row_bytes();
      }
    }
    manifest.layers.push_back(std::move(layer));
  }
  return manifest;
}

absl::Status CheckManifestMatches(const LocalCopyManifest& recorded,
                                  const LocalCopyManifest& expected,
                                  absl::string_view dir) {
  auto mismatch = [&](absl::string_view what) {
    return absl::FailedPreconditionError(
        absl::StrCat("local copy '", dir, "' does not match: ", what));
  };
  if (std::optional<std::string> diff =
          DescribeSourceMismatch(recorded.source, expected.source)) {
    return mismatch(
        absl::StrCat("it was made from a different checkpoint (", *diff, ")"));
  }
  if (!(recorded.target == expected.target)) {
    return mismatch(absl::StrCat("it holds ", DescribeTarget(recorded.target),
                                 ", wanted ", DescribeTarget(expected.target)));
  }
  if (recorded.layers.size() != expected.layers.size()) {
    return mismatch(absl::StrCat("it has ", recorded.layers.size(),
                                 " layers, the checkpoint ",
                                 expected.layers.size()));
  }
  for (size_t i = 0; i < expected.layers.size(); ++i) {
    const LocalCopyLayer& want = expected.layers[i];
    const LocalCopyLayer& have = recorded.layers[i];
    const std::string layer = absl::StrCat("layer ", want.layer, ": ");
    if (have.layer != want.layer) {
      return mismatch(absl::StrCat("layer ", i, " is ", have.layer,
                                   ", the checkpoint's is ", want.layer));
    }
    if (have.format != want.format ||
        have.weight_row_bytes != want.weight_row_bytes ||
        have.scale_row_bytes != want.scale_row_bytes) {
      return mismatch(
          absl::StrCat(layer, "rows are ", formats::RowFormatName(have.format),
                       " (", have.row_bytes(), " bytes), the checkpoint's ",
                       formats::RowFormatName(want.format), " (",
                       want.row_bytes(), " bytes)"));
    }
    if (!SameFloat(have.global_scale, want.global_scale)) {
      return mismatch(absl::StrCat(layer, "global scale ", have.global_scale,
                                   ", the checkpoint's ", want.global_scale));
    }
    if (have.table_rows != want.table_rows) {
      return mismatch(absl::StrCat(layer, "table of ", have.table_rows,
                                   " rows, the checkpoint's has ",
                                   want.table_rows));
    }
    const std::vector<RowRange> have_rows = CoveredRanges(have);
    const std::vector<RowRange> want_rows = CoveredRanges(want);
    if (have_rows != want_rows) {
      return mismatch(absl::StrCat(layer, "it covers ", TotalRows(have_rows),
                                   " rows in ", have_rows.size(), " ranges, ",
                                   DescribeTarget(expected.target), " serves ",
                                   TotalRows(want_rows), " rows in ",
                                   want_rows.size(), " ranges"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::engram
