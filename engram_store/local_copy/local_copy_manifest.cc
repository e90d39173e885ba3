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
#include "nlohmann/json.hpp"

namespace mneme::engram {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos;
}

// Bit equality: a recorded scale must be exactly the checkpoint's.
bool SameFloat(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

std::string Crc32cHex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

// ---------------------------------------------------------------------------
// JSON reading without exceptions: every accessor checks the type before
// nlohmann's get<>() (which throws on a mismatch).

class ManifestReader {
 public:
  explicit ManifestReader(absl::string_view origin) : origin_(origin) {}

  absl::Status Error(absl::string_view where, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("local copy manifest '", origin_,
                                            "': ", where, ": ", what));
  }

  absl::StatusOr<const Json*> Field(const Json& object, const std::string& key,
                                    absl::string_view where) const {
    if (!object.is_object()) return Error(where, "not a JSON object");
    auto it = object.find(key);
    if (it == object.end()) {
      return Error(where, absl::StrCat("missing field \"", key, "\""));
    }
    return &*it;
  }

  absl::StatusOr<int64_t> Int(const Json& object, const std::string& key,
                              absl::string_view where, int64_t min,
                              int64_t max) const {
    absl::StatusOr<const Json*> field = Field(object, key, where);
    if (!field.ok()) return field.status();
    const Json& value = **field;
    int64_t result = 0;
    if (value.is_number_unsigned()) {
      const uint64_t u = value.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(where, absl::StrCat("\"", key, "\" is too large"));
      }
      result = static_cast<int64_t>(u);
    } else if (value.is_number_integer()) {
      result = value.get<int64_t>();
    } else {
      return Error(where, absl::StrCat("\"", key, "\" is not an integer"));
    }
    if (result < min || result > max) {
      return Error(where, absl::StrCat("\"", key, "\" = ", result,
                                       " is outside [", min, ", ", max, "]"));
    }
    return result;
  }

  absl::StatusOr<uint64_t> Uint(const Json& object, const std::string& key,
                                absl::string_view where) const {
    absl::StatusOr<const Json*> field = Field(object, key, where);
    if (!field.ok()) return field.status();
    if (!(*field)->is_number_unsigned()) {
      return Error(where,
                   absl::StrCat("\"", key, "\" is not a non-negative integer"));
    }
    return (*field)->get<uint64_t>();
  }

  absl::StatusOr<double> Number(const Json& object, const std::string& key,
                                absl::string_view where) const {
    absl::StatusOr<const Json*> field = Field(object, key, where);
    if (!field.ok()) return field.status();
    if (!(*field)->is_number()) {
      return Error(where, absl::StrCat("\"", key, "\" is not a number"));
    }
    return (*field)->get<double>();
  }

  absl::StatusOr<std::string> String(const Json& object, const std::string& key,
                                     absl::string_view where) const {
    absl::StatusOr<const Json*> field = Field(object, key, where);
    if (!field.ok()) return field.status();
    if (!(*field)->is_string()) {
      return Error(where, absl::StrCat("\"", key, "\" is not a string"));
    }
    return (*field)->get<std::string>();
  }

  absl::StatusOr<const Json*> Array(const Json& object, const std::string& key,
                                    absl::string_view where) const {
    absl::StatusOr<const Json*> field = Field(object, key, where);
    if (!field.ok()) return field.status();
    if (!(*field)->is_array()) {
      return Error(where, absl::StrCat("\"", key, "\" is not an array"));
    }
    return field;
  }

  absl::StatusOr<const Json*> Object(const Json& object, const std::string& key,
                                     absl::string_view where) const {
    absl::StatusOr<const Json*> field = Field(object, key, where);
    if (!field.ok()) return field.status();
    if (!(*field)->is_object()) {
      return Error(where, absl::StrCat("\"", key, "\" is not an object"));
    }
    return field;
  }

  // An array of integers in [min, max].
  absl::StatusOr<std::vector<int64_t>> IntArray(const Json& object,
                                                const std::string& key,
                                                absl::string_view where,
                                                int64_t min,
                                                int64_t max) const {
    absl::StatusOr<const Json*> array = Array(object, key, where);
    if (!array.ok()) return array.status();
    std::vector<int64_t> values;
    for (size_t i = 0; i < (*array)->size(); ++i) {
      Json wrapper = Json::object();
      wrapper["v"] = (**array)[i];
      absl::StatusOr<int64_t> value = Int(
          wrapper, "v", absl::StrCat(where, ".", key, "[", i, "]"), min, max);
      if (!value.ok()) return value.status();
      values.push_back(*value);
    }
    return values;
  }

 private:
  std::string origin_;
};

absl::StatusOr<formats::RowFormat> ParseFormat(const ManifestReader& reader,
                                               const std::string& name,
                                               absl::string_view where) {
  if (name == formats::RowFormatName(formats::RowFormat::kFp8))
    return formats::RowFormat::kFp8;
  if (name == formats::RowFormatName(formats::RowFormat::kNvfp4))
    return formats::RowFormat::kNvfp4;
  return reader.Error(where, absl::StrCat("unknown format \"", name, "\""));
}

OrderedJson SourceToJson(const SourceIdentity& source) {
  OrderedJson scales = OrderedJson::object();
  for (const auto& [layer, scale] : source.global_scales) {
    scales[absl::StrCat(layer)] = static_cast<double>(scale);
  }
  OrderedJson shards = OrderedJson::array();
  for (const SourceShardIdentity& shard : source.shards) {
    shards.push_back({{"file", shard.file},
                      {"size_bytes", shard.size_bytes},
                      {"mtime_ns", shard.mtime_ns}});
  }
  return {
      {"engram_layer_ids", source.layer_ids},
      {"engram_num_embeddings", source.num_embeddings},
      {"engram_max_ngram_size", source.max_ngram_size},
      {"engram_n_heads", source.n_heads},
      {"engram_head_dim", source.head_dim},
      {"engram_vocab_size", source.vocab_size},
      {"engram_quant", formats::RowFormatName(source.format)},
      {"engram_quant_block_size", source.quant_block_size},
      {"engram_quant_global_scale", scales},
      {"shards", shards},
  };
}

OrderedJson ToJson(const LocalCopyManifest& manifest) {
  OrderedJson layers = OrderedJson::array();
  for (const LocalCopyLayer& layer : manifest.layers) {
    OrderedJson ranges = OrderedJson::array();
    for (const LocalCopyRange& range : layer.ranges) {
      ranges.push_back({{"first_row", range.first_row},
                        {"count", range.count},
                        {"offset", range.offset},
                        {"crc32c", Crc32cHex(range.crc32c)}});
    }
    layers.push_back({
        {"layer", layer.layer},
        {"format", formats::RowFormatName(layer.format)},
        {"table_rows", layer.table_rows},
        {"weight_row_bytes", layer.weight_row_bytes},
        {"scale_row_bytes", layer.scale_row_bytes},
        {"row_bytes", layer.row_bytes()},
        {"global_scale", static_cast<double>(layer.global_scale)},
        {"data_file", layer.data_file},
        {"covered_rows", layer.covered_rows()},
        {"data_bytes", layer.data_bytes()},
        {"ranges", ranges},
    });
  }
  return {
      {"kind", kLocalCopyManifestKind},
      {"version", manifest.version},
      {"checksum", "crc32c"},
      {"source", SourceToJson(manifest.source)},
      {"tp_size", manifest.target.tp_size},
      {"ranks", manifest.target.ranks},
      {"split", ColumnSplitName(manifest.target.split)},
      {"layers", layers},
  };
}

absl::StatusOr<SourceIdentity> ParseSource(const ManifestReader& reader,
                                           const Json& json) {
  constexpr absl::string_view kWhere = "source";
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  SourceIdentity source;
  absl::StatusOr<std::vector<int64_t>> layer_ids =
      reader.IntArray(json, "engram_layer_ids", kWhere, 0, kIntMax);
  if (!layer_ids.ok()) return layer_ids.status();
  for (int64_t id : *layer_ids)
    source.layer_ids.push_back(static_cast<int>(id));
  absl::StatusOr<std::vector<int64_t>> num_embeddings =
      reader.IntArray(json, "engram_num_embeddings", kWhere, 0, kInt64Max);
  if (!num_embeddings.ok()) return num_embeddings.status();
  source.num_embeddings = *std::move(num_embeddings);

  struct IntField {
    const char* key;
    int* out;
  };
  for (const IntField& f :
       {IntField{"engram_max_ngram_size", &source.max_ngram_size},
        IntField{"engram_n_heads", &source.n_heads},
        IntField{"engram_head_dim", &source.head_dim},
        IntField{"engram_quant_block_size", &source.quant_block_size}}) {
    absl::StatusOr<int64_t> value = reader.Int(json, f.key, kWhere, 0, kIntMax);
    if (!value.ok()) return value.status();
    *f.out = static_cast<int>(*value);
  }
  absl::StatusOr<int64_t> vocab_size =
      reader.Int(json, "engram_vocab_size", kWhere, 0, kInt64Max);
  if (!vocab_size.ok()) return vocab_size.status();
  source.vocab_size = *vocab_size;
  absl::StatusOr<std::string> quant =
      reader.String(json, "engram_quant", kWhere);
  if (!quant.ok()) return quant.status();
  absl::StatusOr<formats::RowFormat> format =
      ParseFormat(reader, *quant, kWhere);
  if (!format.ok()) return format.status();
  source.format = *format;

  absl::StatusOr<const Json*> scales =
      reader.Object(json, "engram_quant_global_scale", kWhere);
  if (!scales.ok()) return scales.status();
  for (auto it = (*scales)->begin(); it != (*scales)->end(); ++it) {
    int layer = 0;
    if (!absl::SimpleAtoi(it.key(), &layer)) {
      return reader.Error(
          kWhere, absl::StrCat("engram_quant_global_scale key \"", it.key(),
                               "\" is not a layer id"));
    }
    if (!it.value().is_number()) {
      return reader.Error(kWhere,
                          absl::StrCat("engram_quant_global_scale[\"", it.key(),
                                       "\"] is not a number"));
    }
    source.global_scales[layer] = static_cast<float>(it.value().get<double>());
  }

  absl::StatusOr<const Json*> shards = reader.Array(json, "shards", kWhere);
  if (!shards.ok()) return shards.status();
  for (size_t i = 0; i < (*shards)->size(); ++i) {
    const Json& entry = (**shards)[i];
    const std::string where = absl::StrCat("source.shards[", i, "]");
    SourceShardIdentity shard;
    absl::StatusOr<std::string> file = reader.String(entry, "file", where);
    if (!file.ok()) return file.status();
    if (!IsPlainFileName(*file)) {
      return reader.Error(
          where, absl::StrCat("\"", *file, "\" is not a plain file name"));
    }
    shard.file = *std::move(file);
    absl::StatusOr<uint64_t> size = reader.Uint(entry, "size_bytes", where);
    if (!size.ok()) return size.status();
    shard.size_bytes = *size;
    absl::StatusOr<int64_t> mtime =
        reader.Int(entry, "mtime_ns", where,
                   std::numeric_limits<int64_t>::min(), kInt64Max);
    if (!mtime.ok()) return mtime.status();
    shard.mtime_ns = *mtime;
    source.shards.push_back(std::move(shard));
  }
  return source;
}

absl::StatusOr<LocalCopyLayer> ParseLayer(const ManifestReader& reader,
                                          const Json& json, size_t index) {
  const std::string where = absl::StrCat("layers[", index, "]");
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  LocalCopyLayer layer;
  absl::StatusOr<int64_t> id =
      reader.Int(json, "layer", where, 0, std::numeric_limits<int>::max());
  if (!id.ok()) return id.status();
  layer.layer = static_cast<int>(*id);
  absl::StatusOr<std::string> format_name =
      reader.String(json, "format", where);
  if (!format_name.ok()) return format_name.status();
  absl::StatusOr<formats::RowFormat> format =
      ParseFormat(reader, *format_name, where);
  if (!format.ok()) return format.status();
  layer.format = *format;
  absl::StatusOr<int64_t> table_rows =
      reader.Int(json, "table_rows", where, 1, kInt64Max);
  if (!table_rows.ok()) return table_rows.status();
  layer.table_rows = *table_rows;
  absl::StatusOr<uint64_t> weight =
      reader.Uint(json, "weight_row_bytes", where);
  if (!weight.ok()) return weight.status();
  absl::StatusOr<uint64_t> scale = reader.Uint(json, "scale_row_bytes", where);
  if (!scale.ok()) return scale.status();
  if (*weight != formats::RowWeightBytes(layer.format) ||
      *scale != formats::RowScaleBytes(layer.format)) {
    return reader.Error(
        where, absl::StrCat("row parts of ", *weight, " + ", *scale,
                            " bytes do not match format ", *format_name));
  }
  layer.weight_row_bytes = *weight;
  layer.scale_row_bytes = *scale;
  absl::StatusOr<double> global_scale =
      reader.Number(json, "global_scale", where);
  if (!global_scale.ok()) return global_scale.status();
  layer.global_scale = static_cast<float>(*global_scale);
  absl::StatusOr<std::string> data_file =
      reader.String(json, "data_file", where);
  if (!data_file.ok()) return data_file.status();
  if (!IsPlainFileName(*data_file)) {
    return reader.Error(where, absl::StrCat("data_file \"", *data_file,
                                            "\" is not a plain file name"));
  }
  layer.data_file = *std::move(data_file);

  absl::StatusOr<const Json*> ranges = reader.Array(json, "ranges", where);
  if (!ranges.ok()) return ranges.status();
  const uint64_t row_bytes = layer.row_bytes();
  const int64_t max_rows = static_cast<int64_t>(
      std::min<uint64_t>(static_cast<uint64_t>(kInt64Max) / row_bytes,
                         static_cast<uint64_t>(layer.table_rows)));
  uint64_t next_offset = 0;
  int64_t previous_end = 0;
  for (size_t i = 0; i < (*ranges)->size(); ++i) {
    const Json& entry = (**ranges)[i];
    const std::string range_where = absl::StrCat(where, ".ranges[", i, "]");
    LocalCopyRange range;
    absl::StatusOr<int64_t> first =
        reader.Int(entry, "first_row", range_where, 0, layer.table_rows - 1);
    if (!first.ok()) return first.status();
    absl::StatusOr<int64_t> count =
        reader.Int(entry, "count", range_where, 1, max_rows);
    if (!count.ok()) return count.status();
    if (*count > layer.table_rows - *first) {
      return reader.Error(
          range_where,
          absl::StrCat("rows [", *first, ", ", *first + *count,
                       ") run past the table's ", layer.table_rows, " rows"));
    }
    if (i > 0 && *first < previous_end) {
      return reader.Error(
          range_where,
          absl::StrCat("starts at row ", *first,
                       ", before the previous range's end ", previous_end,
                       " (unsorted or overlapping)"));
    }
    absl::StatusOr<uint64_t> offset = reader.Uint(entry, "offset", range_where);
    if (!offset.ok()) return offset.status();
    if (*offset != next_offset) {
      return reader.Error(range_where,
                          absl::StrCat("offset ", *offset, ", expected ",
                                       next_offset, " (ranges are packed)"));
    }
    absl::StatusOr<std::string> crc =
        reader.String(entry, "crc32c", range_where);
    if (!crc.ok()) return crc.status();
    uint32_t crc_value = 0;
    if (crc->size() != 8 || !absl::SimpleHexAtoi(*crc, &crc_value)) {
      return reader.Error(
          range_where,
          absl::StrCat("crc32c \"", *crc, "\" is not 8 hexadecimal digits"));
    }
    range.first_row = *first;
    range.count = *count;
    range.offset = *offset;
    range.crc32c = crc_value;
    const uint64_t bytes = static_cast<uint64_t>(*count) * row_bytes;
    if (next_offset > std::numeric_limits<uint64_t>::max() - bytes) {
      return reader.Error(range_where, "data offsets overflow");
    }
    next_offset += bytes;
    previous_end = range.end_row();
    layer.ranges.push_back(range);
  }
  // The redundant totals must agree with the ranges.
  absl::StatusOr<uint64_t> data_bytes = reader.Uint(json, "data_bytes", where);
  if (!data_bytes.ok()) return data_bytes.status();
  if (*data_bytes != next_offset) {
    return reader.Error(where, absl::StrCat("data_bytes ", *data_bytes,
                                            ", the ranges hold ", next_offset));
  }
  return layer;
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
  if (absl::Status s = ValidateTarget(target); !s.ok()) return s;
  std::vector<std::vector<RowRange>> per_layer(layout.layers().size());
  for (int rank : target.ranks) {
    absl::StatusOr<RankAssignment> assignment =
        AssignRank(layout, target.split, target.tp_size, rank);
    if (!assignment.ok()) return assignment.status();
    for (size_t i = 0; i < assignment->layers.size(); ++i) {
      const std::vector<RowRange>& rows = assignment->layers[i].column_rows;
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
  absl::StatusOr<std::vector<std::vector<RowRange>>> per_layer =
      TargetRowRanges(layout, target);
  if (!per_layer.ok()) return per_layer.status();
  LocalCopyManifest manifest;
  manifest.source = source;
  manifest.target = target;
  for (size_t i = 0; i < layout.layers().size(); ++i) {
    const int layer_id = layout.layers()[i].layer_id;
    absl::StatusOr<const checkpoint::EngramTableLocation*> table =
        checkpoint.Table(layer_id);
    if (!table.ok()) return table.status();
    const checkpoint::EngramTableLocation& t = **table;
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
    for (const RowRange& range : (*per_layer)[i]) {
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

std::string ManifestToJson(const LocalCopyManifest& manifest) {
  return ToJson(manifest).dump(2, ' ', false, Json::error_handler_t::replace) +
         "\n";
}

std::string ManifestToCompactJson(const LocalCopyManifest& manifest) {
  return ToJson(manifest).dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<LocalCopyManifest> ParseManifest(absl::string_view json,
                                                absl::string_view origin) {
  ManifestReader reader(origin);
  const Json root = Json::parse(json.begin(), json.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return reader.Error("document", "not valid JSON");
  if (!root.is_object()) return reader.Error("document", "not a JSON object");
  absl::StatusOr<std::string> kind = reader.String(root, "kind", "document");
  if (!kind.ok()) return kind.status();
  if (*kind != kLocalCopyManifestKind) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", origin, "' is not a local copy manifest (kind \"", *kind, "\")"));
  }
  LocalCopyManifest manifest;
  absl::StatusOr<int64_t> version = reader.Int(root, "version", "document", 0,
                                               std::numeric_limits<int>::max());
  if (!version.ok()) return version.status();
  if (*version != kLocalCopyFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "local copy manifest '", origin, "' has version ", *version,
        "; this build reads version ", kLocalCopyFormatVersion));
  }
  manifest.version = static_cast<int>(*version);
  absl::StatusOr<std::string> checksum =
      reader.String(root, "checksum", "document");
  if (!checksum.ok()) return checksum.status();
  if (*checksum != "crc32c") {
    return reader.Error("document",
                        absl::StrCat("unknown checksum \"", *checksum, "\""));
  }
  absl::StatusOr<const Json*> source =
      reader.Object(root, "source", "document");
  if (!source.ok()) return source.status();
  absl::StatusOr<SourceIdentity> identity = ParseSource(reader, **source);
  if (!identity.ok()) return identity.status();
  manifest.source = *std::move(identity);

  absl::StatusOr<int64_t> tp_size = reader.Int(root, "tp_size", "document", 1,
                                               std::numeric_limits<int>::max());
  if (!tp_size.ok()) return tp_size.status();
  manifest.target.tp_size = static_cast<int>(*tp_size);
  absl::StatusOr<std::vector<int64_t>> ranks =
      reader.IntArray(root, "ranks", "document", 0, *tp_size - 1);
  if (!ranks.ok()) return ranks.status();
  for (int64_t rank : *ranks) {
    manifest.target.ranks.push_back(static_cast<int>(rank));
  }
  absl::StatusOr<std::string> split = reader.String(root, "split", "document");
  if (!split.ok()) return split.status();
  absl::StatusOr<ColumnSplit> parsed_split = ParseColumnSplit(*split);
  if (!parsed_split.ok()) {
    return reader.Error("document", parsed_split.status().message());
  }
  manifest.target.split = *parsed_split;
  if (absl::Status s = ValidateTarget(manifest.target); !s.ok()) {
    return reader.Error("document", s.message());
  }

  absl::StatusOr<const Json*> layers = reader.Array(root, "layers", "document");
  if (!layers.ok()) return layers.status();
  std::set<int> seen;
  std::set<std::string> files;
  for (size_t i = 0; i < (*layers)->size(); ++i) {
    absl::StatusOr<LocalCopyLayer> layer = ParseLayer(reader, (**layers)[i], i);
    if (!layer.ok()) return layer.status();
    if (!seen.insert(layer->layer).second) {
      return reader.Error(absl::StrCat("layers[", i, "]"),
                          absl::StrCat("layer ", layer->layer, " repeats"));
    }
    if (!files.insert(layer->data_file).second) {
      return reader.Error(absl::StrCat("layers[", i, "]"),
                          absl::StrCat("data file ", layer->data_file,
                                       " is shared with another layer"));
    }
    manifest.layers.push_back(*std::move(layer));
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
