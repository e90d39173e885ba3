#ifndef MNEME_GPU_CPU_CPU_BACKEND_INTERNAL_H_
#define MNEME_GPU_CPU_CPU_BACKEND_INTERNAL_H_

// Internal to gpu/cpu: what the files of CpuBackend (cpu_backend*.cc) share.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <utility>

#include "glog/logging.h"
#include "gpu/backend.h"

namespace mneme::gpu::cpu_backend_internal {

// Work (about one multiply-add per unit) below which a loop is not worth
// splitting over threads.
inline constexpr int64_t kMinWorkPerTask = int64_t{1} << 14;

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Items per task so that each task does at least kMinWorkPerTask.
inline int64_t Grain(int64_t work_per_item) {
  return std::max<int64_t>(
      1, kMinWorkPerTask / std::max<int64_t>(1, work_per_item));
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

inline float Rsqrt(float x) { return 1.0f / std::sqrt(x); }

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

// A weight dequantized to a row-major fp32 [rows, cols] matrix.
class CpuWeight final : public Weight {
 public:
  CpuWeight(WeightFormat format, int64_t rows, int64_t cols,
            AlignedFloats values)
      : format_(format), rows_(rows), cols_(cols), values_(std::move(values)) {}
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  WeightFormat format() const override { return format_; }
  int64_t bytes() const override { return rows_ * cols_ * 4; }
  const float* values() const { return values_.get(); }

 private:
  const WeightFormat format_;
  const int64_t rows_;
  const int64_t cols_;
  const AlignedFloats values_;
};

inline const CpuWeight& AsCpu(const Weight& weight) {
  const auto* cpu = dynamic_cast<const CpuWeight*>(&weight);
  CHECK(cpu != nullptr) << "the weight was not made by a CpuBackend";
  return *cpu;
}

}  // namespace mneme::gpu::cpu_backend_internal

#endif  // MNEME_GPU_CPU_CPU_BACKEND_INTERNAL_H_
