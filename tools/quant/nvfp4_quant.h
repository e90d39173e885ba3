#ifndef MNEME_TOOLS_QUANT_NVFP4_QUANT_H_
#define MNEME_TOOLS_QUANT_NVFP4_QUANT_H_

// The per-block and per-row pieces of the FP8 -> NVFP4 Engram conversion
// (QUANT.md section 1): block scale choice (amax or MSE), round-to-nearest
// quantization of a row, and the method names of the tool.
//
// Arithmetic is the one the decoders use (row_decode.h): a value decodes to
// (E2m1ToFloat(code) * E4m3ToFloat(scale)) * global_scale in fp32, and is
// encoded as FloatToE2m1(x / step) with step = E4m3ToFloat(scale) *
// global_scale, exactly as EncodeNvfp4Row does; rtn-amax is bit-identical to
// EncodeNvfp4Row.
//
// All functions are pure and thread-safe.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/block_pack/fp4_pack.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"

namespace mneme::quant {

// How a block's e4m3 scale is chosen.
enum class ScaleChoice {
  // FloatToE4m3(block_amax / 6 / global_scale).
  kAmax = 0,
  // Every e4m3 code between FloatToE4m3(0.75 * s) and FloatToE4m3(s), with
  // s = block_amax / 6 / global_scale (the e4m3 roundings of [0.75, 1] x s);
  // the one with the least squared block error wins, the largest on ties,
  // so the choice is never worse than kAmax on the block. Code 0 (a zero
  // scale) is never a candidate: a non-zero block keeps a non-zero scale
  // unless its amax scale itself underflows.
  kMse = 1,
};

// How a row's rounding errors are treated.
enum class ErrorFeedback {
  // Round to nearest, value by value (RTN).
  kNone = 0,
  // GPTQ through the hash column's wkv slice (gptq.h).
  kGptq = 1,
};

// One of the four methods of `mneme quantize-engram`.
struct QuantMethod {
  ErrorFeedback feedback = ErrorFeedback::kGptq;
  ScaleChoice scale = ScaleChoice::kMse;
};

// "gptq-mse", "gptq-amax", "rtn-mse", "rtn-amax".
std::string QuantMethodName(const QuantMethod& method);

// Inverse of QuantMethodName(); InvalidArgument listing the four otherwise.
absl::StatusOr<QuantMethod> ParseQuantMethod(absl::string_view name);

// Values per NVFP4 block.
inline constexpr int kBlock = 16;

// The fp32 value an NVFP4 decoder gives for `code` in a block with e4m3
// scale `scale` (see the file comment).
inline float Nvfp4Value(uint8_t code, uint8_t scale, float global_scale) {
  return (formats::E2m1ToFloat(code) * formats::E4m3ToFloat(scale)) *
         global_scale;
}

// FloatToE2m1 without branches (the quantizer's inner loop; fp4_pack.h).
using formats::FastFloatToE2m1;

// The e2m1 code of `x` in a block whose step (E4m3ToFloat(scale) *
// global_scale) is `step`; 0 when the step is 0.
inline uint8_t Nvfp4Code(float x, float step) {
  return step == 0.0f ? uint8_t{0} : FastFloatToE2m1(x / step);
}

// The amax scale of a block: FloatToE4m3(block_amax / 6 / global_scale).
uint8_t AmaxBlockScale(float block_amax, float global_scale);

// Squared error of quantizing the kBlock `values` with e4m3 scale `scale`.
double BlockSquaredError(const float* values, uint8_t scale,
                         float global_scale);

// The e4m3 scale of the kBlock values at `values` under `choice`
// (`global_scale` finite and > 0, values finite). With kMse and a non-null
// `smaller`, *smaller is set to whether the choice is below the amax scale.
uint8_t ChooseBlockScale(const float* values, float global_scale,
                         ScaleChoice choice, bool* smaller = nullptr);

// Counters of one quantized row (or many; Add() sums).
struct RowQuantStats {
  // Blocks whose chosen scale is below the amax scale (kMse only).
  int64_t smaller_scale_blocks = 0;
};

// Quantizes 256 finite values round-to-nearest with block scales chosen by
// `choice`: `weights` receives 128 packed bytes (low nibble = even element),
// `scales` 16 e4m3 codes. A block with a zero step gets code 0 everywhere.
// Adds to *stats when non-null.
void QuantizeRowRtn(const float* values, float global_scale, ScaleChoice choice,
                    uint8_t* weights, uint8_t* scales,
                    RowQuantStats* stats = nullptr);

// Packs 256 e2m1 codes (one per byte, low 4 bits) into 128 bytes, the even
// element in the low nibble.
void PackCodes(const uint8_t* codes, uint8_t* weights);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_NVFP4_QUANT_H_
