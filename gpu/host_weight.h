#ifndef MNEME_GPU_HOST_WEIGHT_H_
#define MNEME_GPU_HOST_WEIGHT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::gpu {

// Checks that `weight`'s byte counts match its format and shape (backend.h
// documents them). InvalidArgument naming the problem (also for more than
// 2^40 elements or a non-finite NVFP4 global scale); DataLoss for a NaN
// weight value or block scale, or a NaN global scale.
absl::Status ValidateHostWeight(const HostWeight& weight);

// Rows [begin, end) of a validated weight as fp32 into out (the whole
// [rows, cols] matrix's storage; only those rows are written). NVFP4 values
// are (e2m1 * scale) * global_scale, the order of the Engram decoders.
void DequantizeRows(const HostWeight& weight, int64_t begin, int64_t end,
                    float* out);

// "f32", "bf16", "fp8 block", "mxfp4", "nvfp4" or "unspecified".
const char* WeightFormatName(WeightFormat format);

// The weight's values as fp32, row-major [rows, cols]; exact for every
// format (each is a product of at most three exactly representable
// factors). Same errors as ValidateHostWeight.
absl::StatusOr<std::vector<float>> DequantizeHostWeight(
    const HostWeight& weight);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_HOST_WEIGHT_H_
