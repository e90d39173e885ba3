#include "tools/quant/engram_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/engram_config.h"
#include "checkpoint/engram_config_loader.h"
#include "checkpoint/engram_table.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/hash_layout.h"
#include "formats/block_pack/fp8_block.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/row_format.h"
#include "tools/quant/blas.h"
#include "tools/quant/output_dir.h"
#include "tools/quant/parallel.h"
#include "tools/quant/shard_file_writer.h"
#include "tools/quant/source_config.h"
#include "tools/quant/wkv_hessian.h"

namespace mneme::quant::engram_internal {
namespace {

namespace fs = std::filesystem;
using formats::RowFormat;

std::string FileName(const std::string& path) {
  return fs::path(path).filename().string();
}

}  // namespace

absl::StatusOr<Source> OpenSource(const std::string& dir) {
  Source source;
  source.dir = dir;
  ASSIGN_OR_RETURN(checkpoint::EngramConfig config,
                   checkpoint::LoadEngramConfig(
                       absl::StrCat(dir, "/", checkpoint::kConfigFileName)));
  source.config = std::move(config);
  if (source.config.format != RowFormat::kFp8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Engram tables of '", dir, "' are ",
        formats::RowFormatName(source.config.format),
        " (engram_quant in config.json), not FP8: quantize-engram converts "
        "FP8 tables only"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardedCheckpoint> checkpoint,
                   checkpoint::ShardedCheckpoint::Create(dir));
  source.checkpoint = std::move(checkpoint);
  ASSIGN_OR_RETURN(
      std::vector<checkpoint::EngramTableLocation> located,
      checkpoint::LocateEngramTables(*source.checkpoint, source.config));
  ASSIGN_OR_RETURN(engram::HashLayout layout,
                   engram::HashLayout::Create(source.config));
  for (size_t i = 0; i < located.size(); ++i) {
    const checkpoint::EngramTableLocation& loc = located[i];
    TableJob job;
    job.layer = loc.layer;
    job.rows = loc.rows;
    job.weight = *source.checkpoint->FindOrNull(
        checkpoint::EngramWeightTensorName(loc.layer));
    job.scale = *source.checkpoint->FindOrNull(
        checkpoint::EngramScaleTensorName(loc.layer));
    job.weight_shard = FileName(loc.shard_path);
    job.scale_shard = FileName(loc.scale_shard_path);
    ASSIGN_OR_RETURN(WkvTensors wkv, LocateWkv(*source.checkpoint, loc.layer,
                                               source.config.NumColumns()));
    job.wkv = wkv;
    job.offsets = layout.layers()[i].offsets;
    job.offsets.push_back(job.rows);
    source.tables.push_back(std::move(job));
  }
  return source;
}

// Reads rows [first, first + count) of a table tensor with `row_bytes`
// bytes per row.
absl::Status ReadRows(const checkpoint::TensorLocation& t, int64_t row_bytes,
                      int64_t first, int64_t count, uint8_t* out) {
  return t.shard->ReadTensorRange(t.info->name, first * row_bytes,
                                  absl::MakeSpan(out, count * row_bytes));
}

absl::Status NanError(int layer, int64_t row) {
  return absl::DataLossError(absl::StrCat(
      "Engram table of layer ", layer, ", row ", row,
      ": NaN or a value beyond fp32 (e4m3 code 0x7F/0xFF or UE8M0 255)"));
}

// Largest |value| of FP8 rows (codes and UE8M0 scales of `count` rows).
// DataLoss for NaN codes or scales and for values beyond fp32.
absl::StatusOr<float> Fp8RowsAmax(int layer, int64_t first_row,
                                  const uint8_t* weights, const uint8_t* scales,
                                  int64_t count) {
  float amax = 0.0f;
  for (int64_t r = 0; r < count; ++r) {
    const float v = formats::Fp8RowAmax(
        absl::MakeConstSpan(weights + r * kFp8Weight, kFp8Weight),
        absl::MakeConstSpan(scales + r * kFp8Scale, kFp8Scale));
    if (!std::isfinite(v)) return NanError(layer, first_row + r);
    amax = std::max(amax, v);
  }
  return amax;
}

std::vector<Task> SplitStep(const TableJob& t, int64_t step_first,
                            int64_t step_rows, int64_t task_rows) {
  std::vector<Task> tasks;
  for (int64_t a = 0; a < step_rows;) {
    const int column = t.ColumnOf(step_first + a);
    const int64_t column_end = t.offsets[column + 1] - step_first;
    const int64_t count = std::min({task_rows, step_rows - a, column_end - a});
    tasks.push_back({a, count, column});
    a += count;
  }
  return tasks;
}

std::string LayerKey(int layer) { return absl::StrCat(layer); }

absl::Status Notify(const EngramProgressCallback& progress,
                    const EngramProgress& update) {
  return progress ? progress(update) : absl::OkStatus();
}

// Reads a (small) JSON file.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text,
                   mneme::ReadSmallFile(path, uint64_t{64} << 20));
  return ParseJsonDocument(text, absl::StrCat("'", path, "'"),
                           {.reject_duplicate_keys = false});
}

double RelativeRoot(double error, double reference) {
  return reference > 0.0 ? std::sqrt(error / reference) : 0.0;
}

}  // namespace mneme::quant::engram_internal
