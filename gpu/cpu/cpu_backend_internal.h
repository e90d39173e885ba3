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
#include "gpu/cpu/quant_kernels.h"

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
  void operator()(void* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

using AlignedBytes = std::unique_ptr<uint8_t[], FreeDeleter>;

// A weight as the CPU backend holds it: fp32 values (kF32 weights, and every
// weight of a backend made with dequantize_weights) or the checkpoint's own
// bytes (codes then scales, in one allocation) read by quant_kernels.
class CpuWeight final : public Weight {
 public:
  // fp32 values, row-major [rows, cols]; `input_scale` the GridBook W4A4
  // input_global_scale the products keep applying (0: none).
  CpuWeight(WeightFormat format, int64_t rows, int64_t cols,
            AlignedFloats values, float input_scale)
      : format_(format),
        rows_(rows),
        cols_(cols),
        values_(std::move(values)),
        input_scale_(input_scale) {}
  // The checkpoint bytes: `bytes` holds data_bytes of codes then the scales;
  // `books` the GridBook tables packed.gridbook_books points to (null for the
  // other formats).
  CpuWeight(const quant_kernels::PackedMatrix& packed, AlignedBytes bytes,
            int64_t total_bytes,
            std::shared_ptr<const formats::gridbook::Codebooks> books)
      : format_(packed.format),
        rows_(packed.rows),
        cols_(packed.cols),
        packed_(packed),
        bytes_(std::move(bytes)),
        packed_bytes_(total_bytes),
        books_(std::move(books)),
        input_scale_(packed.gridbook_input_scale) {}
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  WeightFormat format() const override { return format_; }
  int64_t bytes() const override {
    return values_ != nullptr ? rows_ * cols_ * 4 : packed_bytes_;
  }
  // Null when the weight is packed.
  const float* values() const { return values_.get(); }
  // > 0: activations are quantized by the static W4A4 contract with this
  // input_global_scale before the product (GridBook NVFP4 rungs).
  float input_scale() const { return input_scale_; }
  // The packed matrix (pointing into this weight); only when values() is
  // null.
  const quant_kernels::PackedMatrix& packed() const { return packed_; }

 private:
  const WeightFormat format_;
  const int64_t rows_;
  const int64_t cols_;
  const AlignedFloats values_;
  const quant_kernels::PackedMatrix packed_;
  const AlignedBytes bytes_;
  const int64_t packed_bytes_ = 0;
  // Shared with the other weights of the same GridBook config group.
  const std::shared_ptr<const formats::gridbook::Codebooks> books_;
  const float input_scale_ = 0.0f;
};

inline const CpuWeight& AsCpu(const Weight& weight) {
  const auto* cpu = dynamic_cast<const CpuWeight*>(&weight);
  CHECK(cpu != nullptr) << "the weight was not made by a CpuBackend";
  return *cpu;
}

}  // namespace mneme::gpu::cpu_backend_internal

#endif  // MNEME_GPU_CPU_CPU_BACKEND_INTERNAL_H_
