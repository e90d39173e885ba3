#ifndef MNEME_CHECKPOINT_ENGRAM_TABLE_H_
#define MNEME_CHECKPOINT_ENGRAM_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/engram_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "formats/row_format.h"

namespace mneme::checkpoint {

// Where the rows of one Engram table live on disk: everything the store
// needs to pread row r of layer L without the checkpoint open. Row r's weight
// bytes are [weight_offset + r * weight_row_bytes, +weight_row_bytes) of
// shard_path; its scale bytes [scale_offset + r * scale_row_bytes,
// +scale_row_bytes) of scale_shard_path. Plain data.
struct EngramTableLocation {
  // Engram layer id (an entry of EngramConfig::layer_ids).
  int layer = 0;
  formats::RowFormat format = formats::RowFormat::kUnspecified;
  // Rows of the table (== EngramConfig::num_embeddings of the layer).
  int64_t rows = 0;
  // Shard holding layers.L.engram.embed.weight.
  std::string shard_path;
  // Absolute file offset of row 0's weight bytes.
  uint64_t weight_offset = 0;
  // Weight bytes per row: 256 (FP8) or 128 (NVFP4).
  uint64_t weight_row_bytes = 0;
  // Shard holding layers.L.engram.embed.scale. Equal to shard_path in the
  // V4.1 layout (each layer's tensors share a shard), but not required.
  std::string scale_shard_path;
  // Absolute file offset of row 0's scale bytes.
  uint64_t scale_offset = 0;
  // Scale bytes per row: 8 (FP8) or 16 (NVFP4).
  uint64_t scale_row_bytes = 0;
  // NVFP4 per-table global scale; 1 for FP8.
  float global_scale = 1.0f;
};

// Names of a layer's table tensors: "layers.<layer>.engram.embed.weight" and
// "layers.<layer>.engram.embed.scale".
std::string EngramWeightTensorName(int layer);
std::string EngramScaleTensorName(int layer);

// Locates the table of Engram layer `layer` and checks it against `config`:
// FP8 wants F8_E4M3 [rows, 256] + F8_E8M0 [rows, 8]; NVFP4 wants
// U8 [rows, 128] + F8_E4M3 [rows, 16]; rows must equal the layer's
// num_embeddings.
// InvalidArgument if `layer` is not in config.layer_ids, the config's format
// is unspecified, or an NVFP4 config lacks the layer's global scale; NotFound
// if a tensor is absent; DataLoss (naming the shard and the tensor) for a
// wrong dtype, rank or shape.
absl::StatusOr<EngramTableLocation> LocateEngramTable(
    const ShardedCheckpoint& checkpoint, const EngramConfig& config, int layer);

// LocateEngramTable() for every layer of config.layer_ids, in order.
absl::StatusOr<std::vector<EngramTableLocation>> LocateEngramTables(
    const ShardedCheckpoint& checkpoint, const EngramConfig& config);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_ENGRAM_TABLE_H_
