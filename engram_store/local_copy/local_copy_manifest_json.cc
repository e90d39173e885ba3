// The JSON form of a local copy manifest (local_copy_manifest.h):
// ManifestToJson / ManifestToCompactJson and the strict ParseManifest.

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
#include "common/json.h"
#include "common/status_macros.h"
#include "engram_store/local_copy/local_copy_manifest.h"
#include "nlohmann/json.hpp"

namespace mneme::engram {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;
bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos;
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
      ASSIGN_OR_RETURN(
          int64_t value,
          Int(wrapper, "v", absl::StrCat(where, ".", key, "[", i, "]"), min,
              max));
      values.push_back(value);
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
  ASSIGN_OR_RETURN(
      std::vector<int64_t> layer_ids,
      reader.IntArray(json, "engram_layer_ids", kWhere, 0, kIntMax));
  for (int64_t id : layer_ids) source.layer_ids.push_back(static_cast<int>(id));
  ASSIGN_OR_RETURN(
      std::vector<int64_t> num_embeddings,
      reader.IntArray(json, "engram_num_embeddings", kWhere, 0, kInt64Max));
  source.num_embeddings = std::move(num_embeddings);

  struct IntField {
    const char* key;
    int* out;
  };
  for (const IntField& f :
       {IntField{"engram_max_ngram_size", &source.max_ngram_size},
        IntField{"engram_n_heads", &source.n_heads},
        IntField{"engram_head_dim", &source.head_dim},
        IntField{"engram_quant_block_size", &source.quant_block_size}}) {
    ASSIGN_OR_RETURN(int64_t value,
                     reader.Int(json, f.key, kWhere, 0, kIntMax));
    *f.out = static_cast<int>(value);
  }
  ASSIGN_OR_RETURN(int64_t vocab_size,
                   reader.Int(json, "engram_vocab_size", kWhere, 0, kInt64Max));
  source.vocab_size = vocab_size;
  ASSIGN_OR_RETURN(std::string quant,
                   reader.String(json, "engram_quant", kWhere));
  ASSIGN_OR_RETURN(formats::RowFormat format,
                   ParseFormat(reader, quant, kWhere));
  source.format = format;

  ASSIGN_OR_RETURN(const Json* scales,
                   reader.Object(json, "engram_quant_global_scale", kWhere));
  for (auto it = scales->begin(); it != scales->end(); ++it) {
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

  ASSIGN_OR_RETURN(const Json* shards, reader.Array(json, "shards", kWhere));
  for (size_t i = 0; i < shards->size(); ++i) {
    const Json& entry = (*shards)[i];
    const std::string where = absl::StrCat("source.shards[", i, "]");
    SourceShardIdentity shard;
    ASSIGN_OR_RETURN(std::string file, reader.String(entry, "file", where));
    if (!IsPlainFileName(file)) {
      return reader.Error(
          where, absl::StrCat("\"", file, "\" is not a plain file name"));
    }
    shard.file = std::move(file);
    ASSIGN_OR_RETURN(uint64_t size, reader.Uint(entry, "size_bytes", where));
    shard.size_bytes = size;
    ASSIGN_OR_RETURN(
        int64_t mtime,
        reader.Int(entry, "mtime_ns", where,
                   std::numeric_limits<int64_t>::min(), kInt64Max));
    shard.mtime_ns = mtime;
    source.shards.push_back(std::move(shard));
  }
  return source;
}

absl::StatusOr<LocalCopyLayer> ParseLayer(const ManifestReader& reader,
                                          const Json& json, size_t index) {
  const std::string where = absl::StrCat("layers[", index, "]");
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  LocalCopyLayer layer;
  ASSIGN_OR_RETURN(int64_t id, reader.Int(json, "layer", where, 0,
                                          std::numeric_limits<int>::max()));
  layer.layer = static_cast<int>(id);
  ASSIGN_OR_RETURN(std::string format_name,
                   reader.String(json, "format", where));
  ASSIGN_OR_RETURN(formats::RowFormat format,
                   ParseFormat(reader, format_name, where));
  layer.format = format;
  ASSIGN_OR_RETURN(int64_t table_rows,
                   reader.Int(json, "table_rows", where, 1, kInt64Max));
  layer.table_rows = table_rows;
  ASSIGN_OR_RETURN(uint64_t weight,
                   reader.Uint(json, "weight_row_bytes", where));
  ASSIGN_OR_RETURN(uint64_t scale, reader.Uint(json, "scale_row_bytes", where));
  if (weight != formats::RowWeightBytes(layer.format) ||
      scale != formats::RowScaleBytes(layer.format)) {
    return reader.Error(
        where, absl::StrCat("row parts of ", weight, " + ", scale,
                            " bytes do not match format ", format_name));
  }
  layer.weight_row_bytes = weight;
  layer.scale_row_bytes = scale;
  ASSIGN_OR_RETURN(double global_scale,
                   reader.Number(json, "global_scale", where));
  layer.global_scale = static_cast<float>(global_scale);
  ASSIGN_OR_RETURN(std::string data_file,
                   reader.String(json, "data_file", where));
  if (!IsPlainFileName(data_file)) {
    return reader.Error(where, absl::StrCat("data_file \"", data_file,
                                            "\" is not a plain file name"));
  }
  layer.data_file = std::move(data_file);

  ASSIGN_OR_RETURN(const Json* ranges, reader.Array(json, "ranges", where));
  const uint64_t row_bytes = layer.row_bytes();
  const int64_t max_rows = static_cast<int64_t>(
      std::min<uint64_t>(static_cast<uint64_t>(kInt64Max) / row_bytes,
                         static_cast<uint64_t>(layer.table_rows)));
  uint64_t next_offset = 0;
  int64_t previous_end = 0;
  for (size_t i = 0; i < ranges->size(); ++i) {
    const Json& entry = (*ranges)[i];
    const std::string range_where = absl::StrCat(where, ".ranges[", i, "]");
    LocalCopyRange range;
    ASSIGN_OR_RETURN(int64_t first, reader.Int(entry, "first_row", range_where,
                                               0, layer.table_rows - 1));
    ASSIGN_OR_RETURN(int64_t count,
                     reader.Int(entry, "count", range_where, 1, max_rows));
    if (count > layer.table_rows - first) {
      return reader.Error(
          range_where,
          absl::StrCat("rows [", first, ", ", first + count,
                       ") run past the table's ", layer.table_rows, " rows"));
    }
    if (i > 0 && first < previous_end) {
      return reader.Error(
          range_where,
          absl::StrCat("starts at row ", first,
                       ", before the previous range's end ", previous_end,
                       " (unsorted or overlapping)"));
    }
    ASSIGN_OR_RETURN(uint64_t offset,
                     reader.Uint(entry, "offset", range_where));
    if (offset != next_offset) {
      return reader.Error(range_where,
                          absl::StrCat("offset ", offset, ", expected ",
                                       next_offset, " (ranges are packed)"));
    }
    ASSIGN_OR_RETURN(std::string crc,
                     reader.String(entry, "crc32c", range_where));
    uint32_t crc_value = 0;
    if (crc.size() != 8 || !absl::SimpleHexAtoi(crc, &crc_value)) {
      return reader.Error(
          range_where,
          absl::StrCat("crc32c \"", crc, "\" is not 8 hexadecimal digits"));
    }
    range.first_row = first;
    range.count = count;
    range.offset = offset;
    range.crc32c = crc_value;
    const uint64_t bytes = static_cast<uint64_t>(count) * row_bytes;
    if (next_offset > std::numeric_limits<uint64_t>::max() - bytes) {
      return reader.Error(range_where, "data offsets overflow");
    }
    next_offset += bytes;
    previous_end = range.end_row();
    layer.ranges.push_back(range);
  }
  // The redundant totals must agree with the ranges.
  ASSIGN_OR_RETURN(uint64_t data_bytes, reader.Uint(json, "data_bytes", where));
  if (data_bytes != next_offset) {
    return reader.Error(where, absl::StrCat("data_bytes ", data_bytes,
                                            ", the ranges hold ", next_offset));
  }
  return layer;
}

}  // namespace

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
  const ParsedJson parsed = ParseJson(json);
  if (parsed.too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local copy manifest '", origin,
        "' nests arrays / objects deeper than the limit of ", kMaxJsonDepth));
  }
  const Json& root = parsed.value;
  if (root.is_discarded()) return reader.Error("document", "not valid JSON");
  if (!root.is_object()) return reader.Error("document", "not a JSON object");
  ASSIGN_OR_RETURN(std::string kind, reader.String(root, "kind", "document"));
  if (kind != kLocalCopyManifestKind) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", origin, "' is not a local copy manifest (kind \"", kind, "\")"));
  }
  LocalCopyManifest manifest;
  ASSIGN_OR_RETURN(int64_t version,
                   reader.Int(root, "version", "document", 0,
                              std::numeric_limits<int>::max()));
  if (version != kLocalCopyFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("local copy manifest '", origin, "' has version ", version,
                     "; this build reads version ", kLocalCopyFormatVersion));
  }
  manifest.version = static_cast<int>(version);
  ASSIGN_OR_RETURN(std::string checksum,
                   reader.String(root, "checksum", "document"));
  if (checksum != "crc32c") {
    return reader.Error("document",
                        absl::StrCat("unknown checksum \"", checksum, "\""));
  }
  ASSIGN_OR_RETURN(const Json* source,
                   reader.Object(root, "source", "document"));
  ASSIGN_OR_RETURN(SourceIdentity identity, ParseSource(reader, *source));
  manifest.source = std::move(identity);

  ASSIGN_OR_RETURN(int64_t tp_size,
                   reader.Int(root, "tp_size", "document", 1,
                              std::numeric_limits<int>::max()));
  manifest.target.tp_size = static_cast<int>(tp_size);
  ASSIGN_OR_RETURN(std::vector<int64_t> ranks,
                   reader.IntArray(root, "ranks", "document", 0, tp_size - 1));
  for (int64_t rank : ranks) {
    manifest.target.ranks.push_back(static_cast<int>(rank));
  }
  ASSIGN_OR_RETURN(std::string split, reader.String(root, "split", "document"));
  absl::StatusOr<ColumnSplit> parsed_split = ParseColumnSplit(split);
  if (!parsed_split.ok()) {
    return reader.Error("document", parsed_split.status().message());
  }
  manifest.target.split = *parsed_split;
  if (absl::Status s = ValidateTarget(manifest.target); !s.ok()) {
    return reader.Error("document", s.message());
  }

  ASSIGN_OR_RETURN(const Json* layers,
                   reader.Array(root, "layers", "document"));
  std::set<int> seen;
  std::set<std::string> files;
  for (size_t i = 0; i < layers->size(); ++i) {
    ASSIGN_OR_RETURN(LocalCopyLayer layer, ParseLayer(reader, (*layers)[i], i));
    if (!seen.insert(layer.layer).second) {
      return reader.Error(absl::StrCat("layers[", i, "]"),
                          absl::StrCat("layer ", layer.layer, " repeats"));
    }
    if (!files.insert(layer.data_file).second) {
      return reader.Error(absl::StrCat("layers[", i, "]"),
                          absl::StrCat("data file ", layer.data_file,
                                       " is shared with another layer"));
    }
    manifest.layers.push_back(std::move(layer));
  }
  return manifest;
}
}  // namespace mneme::engram
