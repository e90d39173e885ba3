#ifndef MNEME_TOOLS_QUANT_ENGRAM_QUANTIZER_H_
#define MNEME_TOOLS_QUANT_ENGRAM_QUANTIZER_H_

// FP8 -> NVFP4 conversion of a checkpoint's Engram tables (QUANT.md section
// 1; the library behind `mneme quantize-engram`).
//
// Per table: pass 1 reads every row for the tensor amax and the global scale
// amax / (6 x 448); then the per-column wkv Hessians are built (wkv_hessian.h,
// gptq.h); pass 2 converts the rows in steps of rows_per_step rows, each
// step read, quantized on all threads (tasks of up to 256 rows of one hash
// column) and written before the next is read, so memory is bounded by the
// step (~410 bytes per row plus per-thread scratch).
//
// Output directory: the shards holding the tables are rewritten under their
// own names with embed.weight U8 [rows, 128] and embed.scale F8_E4M3
// [rows, 16], every other tensor of those shards copied verbatim; the index
// keeps its weight_map with total_size recomputed; config.json gains the
// engram_quant keys and the global scales; engram-nvfp4.json holds the
// report; every other file is linked (output_dir.h). The directory is built
// as OUT.partial and renamed when complete; its journal records each step
// once the step's bytes are durable, so a run that stops (crash, kill, full
// disk, an error returned by the progress callback) is resumed by running
// again with the same source and method.
//
// Report errors (per table): relative RMS ||deq - fp8||_2 / ||fp8||_2 over
// every row (deq = the fp32 NVFP4 decode, before any bf16 rounding); error
// through wkv sqrt(sum ||W_c (deq - fp8)||^2 / sum ||W_c fp8||^2) over the
// rows r with r % wkv_sample_stride == 0 (stride = ceil(rows /
// wkv_error_rows), all rows of small tables); scale underflows = blocks whose
// FP8 values are not all zero but whose scale x global scale is zero.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/quant/gptq.h"
#include "tools/quant/nvfp4_quant.h"

namespace mneme::quant {

// File name of the report in the output directory.
inline constexpr char kEngramReportFileName[] = "engram-nvfp4.json";

// Where a conversion is, for progress display. Plain data.
struct EngramProgress {
  enum class Phase { kAmax, kQuantize, kVerify };
  int layer = 0;
  Phase phase = Phase::kQuantize;
  // Rows of this table done in this phase (including ones an earlier,
  // interrupted run did) and in total.
  int64_t rows_done = 0;
  int64_t rows_total = 0;
  // Rows done by this run in this phase, and its seconds so far: the rate.
  int64_t rows_this_run = 0;
  double seconds = 0.0;
};

// Called after each durable step; a non-OK return stops the run with that
// status (the output stays resumable).
using EngramProgressCallback =
    std::function<absl::Status(const EngramProgress&)>;

// Whether the output is re-read and its report recomputed.
enum class VerifyOutput { kNo = 0, kYes = 1 };

struct EngramQuantizeOptions {
  // Source checkpoint directory (FP8 Engram tables). Required.
  std::string checkpoint_dir;
  // Output directory; must not exist. Required.
  std::string out_dir;
  // Default: gptq-mse.
  QuantMethod method;
  // Rows per step of pass 1 and 2; >= 1. Default: 2,000,000.
  int64_t rows_per_step = 2'000'000;
  // Worker threads; 0 = all cores. Default: 0.
  int threads = 0;
  // Rows per table measured through wkv (about; see the file comment);
  // >= 1. Default: 300,000 (the published sample size).
  int64_t wkv_error_rows = 300'000;
  // GPTQ lazy batch, a multiple of 16 dividing 256. Default: 32.
  int gptq_batch_columns = 32;
  // GPTQ damping fraction of mean(diag H); >= 0. Default: 0.01.
  double damp_fraction = kDefaultDampFraction;
  // Re-read the finished output (before it is renamed into place) and
  // recompute the report; DataLoss if it disagrees. Default: kNo.
  VerifyOutput verify = VerifyOutput::kNo;
  // Progress and cancellation. Default: none.
  EngramProgressCallback progress;
};

// The sums a table's report is made of; chunk results are added in a fixed
// order. Plain data.
struct EngramErrorSums {
  int64_t rows = 0;
  int64_t blocks = 0;
  double error_squares = 0.0;      // sum (deq - fp8)^2
  double reference_squares = 0.0;  // sum fp8^2
  int64_t wkv_rows = 0;
  double wkv_error_squares = 0.0;      // sum ||W_c (deq - fp8)||^2
  double wkv_reference_squares = 0.0;  // sum ||W_c fp8||^2
  int64_t scale_underflows = 0;
  int64_t smaller_scale_blocks = 0;

  void Add(const EngramErrorSums& other);
  nlohmann::json ToJson() const;
  static EngramErrorSums FromJson(const nlohmann::json& json);
};

// One table of the report.
struct EngramTableReport {
  int layer = 0;
  std::string method;
  // Output shard holding the table's weights (file name).
  std::string shard;
  int64_t rows = 0;
  float amax = 0.0f;
  float global_scale = 0.0f;
  int64_t wkv_sample_stride = 1;
  EngramErrorSums sums;
  double seconds = 0.0;

  double RelativeRms() const;
  double WkvRelativeRms() const;
  nlohmann::json ToJson() const;
};

struct EngramQuantReport {
  std::string source;
  std::string method;
  // Whether this run continued an interrupted one.
  bool resumed = false;
  std::vector<EngramTableReport> tables;
  // The OpenBLAS kernels the products ran on (blas.h).
  std::string blas_core;
  // Bytes of the Engram shards before and after.
  uint64_t source_shard_bytes = 0;
  uint64_t output_shard_bytes = 0;
  // With VerifyOutput::kYes: the recomputed numbers.
  std::optional<nlohmann::json> verify;

  nlohmann::json ToJson() const;
};

// Converts options.checkpoint_dir into options.out_dir (see the file
// comment) and returns the report also written there.
// InvalidArgument for bad options, a source whose Engram tables are not FP8
// (e.g. already NVFP4), or wkv in an unsupported dtype; NotFound for a
// missing source, config.json or tensor (embed.scale, wkv.scale, ...);
// DataLoss for inconsistent shapes or corrupt files (NaN values included);
// FailedPrecondition if the output exists, or OUT.partial belongs to another
// run; ResourceExhausted and other errno-derived codes for I/O failures
// (full disk); the callback's status if it stops the run. The source is only
// read.
absl::StatusOr<EngramQuantReport> QuantizeEngramCheckpoint(
    const EngramQuantizeOptions& options);

struct EngramVerifyOptions {
  // The FP8 source. Required.
  std::string checkpoint_dir;
  // A finished output (with its engram-nvfp4.json). Required.
  std::string out_dir;
  // Default: 2,000,000.
  int64_t rows_per_step = 2'000'000;
  // 0 = all cores. Default: 0.
  int threads = 0;
  // Default: none.
  EngramProgressCallback progress;
};

// Re-reads an output against its source and recomputes every table's
// report numbers independently of the conversion (FP8 and NVFP4 rows
// through the row decoders, errors through wkv in double precision from the
// output's wkv). Returns {"tables": [{layer, rows, amax, global_scale,
// relative_rms, wkv_relative_rms, wkv_rows, scale_underflows}], "ok": true}.
// DataLoss naming the table and the number if a recomputed value differs
// from the report (relative RMS by more than 1e-9 relative, the wkv error by
// more than 1e-4, counts and scales at all); errors of opening either
// checkpoint otherwise.
absl::StatusOr<nlohmann::json> VerifyEngramCheckpoint(
    const EngramVerifyOptions& options);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_ENGRAM_QUANTIZER_H_
