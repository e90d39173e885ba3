#ifndef MNEME_TOOLS_QUANT_ENGRAM_SOURCE_H_
#define MNEME_TOOLS_QUANT_ENGRAM_SOURCE_H_

// Internal to the engram_quantizer library: the source checkpoint's Engram
// tables as the conversion (engram_quantizer.cc) and its verification
// (engram_verify.cc) read them, and the helpers both passes share.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/engram_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "formats/row_format.h"
#include "nlohmann/json.hpp"
#include "tools/quant/engram_quantizer.h"
#include "tools/quant/nvfp4_quant.h"
#include "tools/quant/wkv_hessian.h"

namespace mneme::quant::engram_internal {

constexpr int kN = formats::kRowDim;
constexpr int kBlocksPerRow = kN / kBlock;
constexpr int64_t kFp8Weight = formats::kFp8WeightBytes;
constexpr int64_t kFp8Scale = formats::kFp8ScaleBytes;
constexpr int64_t kNvWeight = formats::kNvfp4WeightBytes;
constexpr int64_t kNvScale = formats::kNvfp4ScaleBytes;
// Rows per task of pass 2 (all of one hash column) and of the other passes.
constexpr int64_t kTaskRows = 256;
constexpr int64_t kScanTaskRows = 16384;

// One Engram table of the source.
struct TableJob {
  int layer = 0;
  int64_t rows = 0;
  checkpoint::TensorLocation weight;
  checkpoint::TensorLocation scale;
  // File names (relative to the checkpoint) of the shards holding them.
  std::string weight_shard;
  std::string scale_shard;
  WkvTensors wkv;
  // First row of each hash column, then the row count.
  std::vector<int64_t> offsets;

  int ColumnOf(int64_t row) const {
    return static_cast<int>(
        std::upper_bound(offsets.begin(), offsets.end(), row) -
        offsets.begin() - 1);
  }
};

// The source checkpoint, opened and checked.
struct Source {
  std::string dir;
  checkpoint::EngramConfig config;
  std::unique_ptr<checkpoint::ShardedCheckpoint> checkpoint;
  std::vector<TableJob> tables;
};

// Opens the checkpoint at `dir` and locates its Engram tables and their wkv
// tensors. InvalidArgument when the tables are not FP8.
absl::StatusOr<Source> OpenSource(const std::string& dir);

// Reads rows [first, first + count) of a table tensor with `row_bytes`
// bytes per row.
absl::Status ReadRows(const checkpoint::TensorLocation& t, int64_t row_bytes,
                      int64_t first, int64_t count, uint8_t* out);

// DataLoss naming the layer and row of a NaN (or a value beyond fp32).
absl::Status NanError(int layer, int64_t row);

// Largest |value| of FP8 rows (codes and UE8M0 scales of `count` rows).
// DataLoss for NaN codes or scales and for values beyond fp32.
absl::StatusOr<float> Fp8RowsAmax(int layer, int64_t first_row,
                                  const uint8_t* weights, const uint8_t* scales,
                                  int64_t count);

// The tasks of one step: runs of at most kTaskRows rows of one hash column.
struct Task {
  int64_t first = 0;  // Row index within the step.
  int64_t count = 0;
  int column = 0;
};

// Splits rows [step_first, step_first + step_rows) of `t` into tasks.
std::vector<Task> SplitStep(const TableJob& t, int64_t step_first,
                            int64_t step_rows, int64_t task_rows);

// The key of a layer in the journal and the config ("7").
std::string LayerKey(int layer);

// Calls `progress` (when set) with `update`.
absl::Status Notify(const EngramProgressCallback& progress,
                    const EngramProgress& update);

// Reads a (small) JSON file. DataLoss if it is not valid JSON.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

// sqrt(error / reference), 0 for a zero reference.
double RelativeRoot(double error, double reference);

}  // namespace mneme::quant::engram_internal

#endif  // MNEME_TOOLS_QUANT_ENGRAM_SOURCE_H_
