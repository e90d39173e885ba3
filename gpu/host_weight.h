#ifndef MNEME_GPU_HOST_WEIGHT_H_
#define MNEME_GPU_HOST_WEIGHT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::gpu {

// Checks that `weight`'s byte counts match its format and shape (backend.h
// documents them). InvalidArgument naming the problem; DataLoss for a NaN
// block scale.
absl::Status ValidateHostWeight(const HostWeight& weight);

// The weight's values as fp32, row-major [rows, cols]; exact for every
// format (each is a product of at most three exactly representable
// factors). Same errors as ValidateHostWeight.
absl::StatusOr<std::vector<float>> DequantizeHostWeight(
    const HostWeight& weight);

// Bytes of the codes of a weight of this format and shape.
int64_t WeightDataBytes(WeightFormat format, int64_t rows, int64_t cols);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_HOST_WEIGHT_H_
