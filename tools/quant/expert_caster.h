#ifndef MNEME_TOOLS_QUANT_EXPERT_CASTER_H_
#define MNEME_TOOLS_QUANT_EXPERT_CASTER_H_

// The lossless MXFP4 -> NVFP4 cast of a checkpoint's routed experts (QUANT.md
// section 2; the library behind `mneme cast-experts`).
//
// Routed expert weights are the tensors named <P>.ffn.experts.<E>.w{1,2,3}
// .weight, P a main layer ("layers.L") or a draft stage ("mtp.S"): U8 (or
// I8) [out, in / 2] packed e2m1 with a .scale sibling F8_E8M0 [out, in / 32].
// Each becomes .weight (U8, the same nibbles), .weight_scale (F8_E4M3
// [out, in / 16]), .weight_scale_2 (F32 scalar, 2^(k_max - 8), shared by w1
// and w3 of an expert: k_max over both) and .input_scale (F32 scalar, from a
// calibration file); the .scale sibling is dropped (mxfp4_cast.h has the
// arithmetic).
//
// Output directory (output_dir.h; OUT.partial renamed when complete,
// resumable shard by shard): the shards holding experts rewritten under
// their names, other tensors copied verbatim; the index with the new names
// and total_size recomputed; config.json with moe_quant_algo "NVFP4" and
// moe_quant_group_size 16 (in text_config when present);
// hf_quant_config.json; the report experts-nvfp4.json (blocks, castable and
// lossless blocks, largest dequantization error, per layer and in total,
// the first lossy blocks, and whether input scales were calibrated). Every
// other file is linked.
//
// Calibration file: {"input_scale": {"<P>.ffn.experts.<E>.w<i>": 0.0123,
// ...}}, one finite positive fp32 per expert weight (the activation amax /
// (6 x 448) of that projection's input). Entries for other names are
// ignored (counted in the report).

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace mneme::quant {

inline constexpr char kExpertReportFileName[] = "experts-nvfp4.json";
inline constexpr char kHfQuantConfigFileName[] = "hf_quant_config.json";

// Where the input scales come from.
enum class InputScales {
  // A calibration file (ExpertCastOptions::calibration_path).
  kCalibrated = 0,
  // None: every input_scale is 1.0, and the report says so.
  kUncalibrated = 1,
};

struct ExpertCastOptions {
  // Source checkpoint directory. Required.
  std::string checkpoint_dir;
  // Output directory; must not exist. Required.
  std::string out_dir;
  // Default: kCalibrated.
  InputScales input_scales = InputScales::kCalibrated;
  // The calibration JSON; required with kCalibrated, must be empty with
  // kUncalibrated. Default: empty.
  std::string calibration_path;
  // Worker threads; 0 = all cores. Default: 0.
  int threads = 0;
  // Lossy blocks listed in the report (the count is always complete).
  // Default: 32.
  int max_listed_lossy_blocks = 32;
  // Called after each expert weight is written with (done, total); a non-OK
  // return stops the run (resumable). Default: none.
  std::function<absl::Status(int64_t done, int64_t total)> progress;
};

// Casts options.checkpoint_dir into options.out_dir and returns the report
// also written there. InvalidArgument for bad options (no calibration
// without kUncalibrated, both), a calibration file without an entry for an
// expert weight or with a bad value, a source without MXFP4 routed experts
// or whose experts are already NVFP4 or not U8/I8, a scale not F8_E8M0;
// NotFound for a missing source or .scale sibling; DataLoss for shapes that
// do not match ([out, in / 2] vs [out, in / 32]) or NaN scales;
// FailedPrecondition if the output exists or OUT.partial belongs to another
// run; errno-derived codes (ResourceExhausted: full disk) for I/O. The
// source is only read.
absl::StatusOr<nlohmann::json> CastExpertsCheckpoint(
    const ExpertCastOptions& options);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_EXPERT_CASTER_H_
