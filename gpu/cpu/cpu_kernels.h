#ifndef MNEME_GPU_CPU_CPU_KERNELS_H_
#define MNEME_GPU_CPU_CPU_KERNELS_H_

// Internal to gpu/cpu: the fp32 inner loops of the CPU backend, written with
// Highway and compiled for every SIMD target the compiler can reach; each call
// runs the best one this CPU supports (dynamic dispatch). Sums are taken in
// several vector accumulators, so results differ from a sequential loop by
// rounding only. Pointers need no alignment; n may be any count >= 0.
//
// All functions are thread-safe (no state).

#include <cstdint>

namespace mneme::gpu::cpu_kernels {

// sum_i a[i] * b[i].
float Dot(const float* a, const float* b, int64_t n);

// sum_i x[i]^2.
float SumSquares(const float* x, int64_t n);

// y[i] = x[i] * s * w[i], or x[i] * s when w is null. y may alias x.
void ScaleRow(const float* x, float s, const float* w, float* y, int64_t n);

// y[i] += a * x[i]. x and y do not overlap.
void Axpy(float a, const float* x, float* y, int64_t n);

// y[i] *= a.
void Scale(float a, float* y, int64_t n);

// y[i] = a[i] + b[i]. y may alias a or b.
void Add(const float* a, const float* b, float* y, int64_t n);

// out[r] = scale * (q . rows[r]) for the num_rows rows of `dim` floats that
// start at `rows` (row-major).
void DotRows(const float* q, const float* rows, int64_t num_rows, int64_t dim,
             float scale, float* out);

// out[i] += sum_r weights[r] * rows[r, i] over num_rows rows of `dim` floats.
// out does not overlap rows.
void WeightedRowSum(const float* weights, const float* rows, int64_t num_rows,
                    int64_t dim, float* out);

// The three sums of the Engram gate, in one pass.
struct EngramSums {
  float dot = 0.0f;  // sum_i x[i] * q[i] * k[i] * key[i]
  float xx = 0.0f;   // sum_i x[i]^2
  float kk = 0.0f;   // sum_i key[i]^2
};
EngramSums EngramDot(const float* x, const float* q, const float* k,
                     const float* key, int64_t n);

// The Highway target the functions dispatch to, e.g. "AVX2".
const char* SimdTargetName();

}  // namespace mneme::gpu::cpu_kernels

#endif  // MNEME_GPU_CPU_CPU_KERNELS_H_
