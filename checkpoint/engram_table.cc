#include "checkpoint/engram_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/dtype.h"
#include "common/status_macros.h"

namespace mneme::checkpoint {
namespace {

// Checks one table tensor: dtype and shape [rows, columns].
absl::Status CheckTensor(const TensorLocation& location, DType dtype,
                         int64_t rows, int64_t columns,
                         formats::RowFormat format) {
  const TensorInfo& info = *location.info;
  const std::vector<int64_t> want = {rows, columns};
  if (info.dtype != dtype || info.shape != want) {
    return absl::DataLossError(
        absl::StrCat("safetensors file '", location.shard->path(), "', tensor ",
                     QuoteTensorName(info.name), ": is ", DTypeName(info.dtype),
                     " [", absl::StrJoin(info.shape, ", "), "] but an ",
                     formats::RowFormatName(format), " Engram table needs ",
                     DTypeName(dtype), " [", absl::StrJoin(want, ", "), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EngramWeightTensorName(int layer) {
  return absl::StrCat("layers.", layer, ".engram.embed.weight");
}

std::string EngramScaleTensorName(int layer) {
  return absl::StrCat("layers.", layer, ".engram.embed.scale");
}

absl::StatusOr<EngramTableLocation> LocateEngramTable(
    const ShardedCheckpoint& checkpoint, const EngramConfig& config,
    int layer) {
  auto it = std::find(config.layer_ids.begin(), config.layer_ids.end(), layer);
  if (it == config.layer_ids.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is not an Engram layer of checkpoint '",
                     checkpoint.dir(), "' (engram_layer_ids: [",
                     absl::StrJoin(config.layer_ids, ", "), "])"));
  }
  const size_t layer_index = static_cast<size_t>(it - config.layer_ids.begin());
  if (layer_index >= config.num_embeddings.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Engram config of checkpoint '", checkpoint.dir(),
                     "' has no num_embeddings entry for layer ", layer));
  }
  EngramTableLocation table;
  table.layer = layer;
  table.format = config.format;
  table.rows = config.num_embeddings[layer_index];

  DType weight_dtype;
  DType scale_dtype;
  switch (config.format) {
    case formats::RowFormat::kFp8:
      weight_dtype = DType::kF8E4M3;
      scale_dtype = DType::kF8E8M0;
      break;
    case formats::RowFormat::kNvfp4: {
      weight_dtype = DType::kU8;
      scale_dtype = DType::kF8E4M3;
      auto scale = config.global_scales.find(layer);
      if (scale == config.global_scales.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "NVFP4 Engram config of checkpoint '", checkpoint.dir(),
            "' has no global scale for layer ", layer));
      }
      table.global_scale = scale->second;
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Engram config of checkpoint '", checkpoint.dir(),
                       "' has an unspecified row format"));
  }
  table.weight_row_bytes = formats::RowWeightBytes(config.format);
  table.scale_row_bytes = formats::RowScaleBytes(config.format);

  ASSIGN_OR_RETURN(TensorLocation weight,
                   checkpoint.Find(EngramWeightTensorName(layer)));
  ASSIGN_OR_RETURN(TensorLocation scale,
                   checkpoint.Find(EngramScaleTensorName(layer)));
  RETURN_IF_ERROR(CheckTensor(weight, weight_dtype, table.rows,
                              static_cast<int64_t>(table.weight_row_bytes),
                              config.format));
  RETURN_IF_ERROR(CheckTensor(scale, scale_dtype, table.rows,
                              static_cast<int64_t>(table.scale_row_bytes),
                              config.format));

  table.shard_path = weight.shard->path();
  table.weight_offset = weight.info->offset;
  table.scale_shard_path = scale.shard->path();
  table.scale_offset = scale.info->offset;
  return table;
}

absl::StatusOr<std::vector<EngramTableLocation>> LocateEngramTables(
    const ShardedCheckpoint& checkpoint, const EngramConfig& config) {
  std::vector<EngramTableLocation> tables;
  tables.reserve(config.layer_ids.size());
  for (int layer : config.layer_ids) {
    ASSIGN_OR_RETURN(EngramTableLocation table,
                     LocateEngramTable(checkpoint, config, layer));
    tables.push_back(std::move(table));
  }
  return tables;
}

}  // namespace mneme::checkpoint
