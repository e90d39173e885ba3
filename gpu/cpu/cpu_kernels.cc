// Highway kernels of cpu_kernels.h. This file is compiled once per SIMD
// target by hwy/foreach_target.h (it includes itself), and
// HWY_DYNAMIC_DISPATCH picks the best target the CPU supports at run time
// (the pattern of formats/row_decode_simd.cc).

#include "gpu/cpu/cpu_kernels.h"

#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "gpu/cpu/cpu_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mneme::gpu::cpu_kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

int64_t CurrentTarget() { return HWY_TARGET; }

// The sum of the lanes of four accumulators.
HWY_INLINE float SumOf(DF d, VF a, VF b, VF c, VF e) {
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a, b), hn::Add(c, e))));
}

float DotKernel(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                int64_t count) {
  const DF d;
  const size_t n = static_cast<size_t>(count);
  const size_t lanes = hn::Lanes(d);
  VF s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + lanes), hn::LoadU(d, b + i + lanes),
                    s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * lanes),
                    hn::LoadU(d, b + i + 2 * lanes), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * lanes),
                    hn::LoadU(d, b + i + 3 * lanes), s3);
  }
  for (; i + lanes <= n; i += lanes) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  }
  float sum = SumOf(d, s0, s1, s2, s3);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float SumSquaresKernel(const float* HWY_RESTRICT x, int64_t count) {
  return DotKernel(x, x, count);
}

// No HWY_RESTRICT: y may alias x.
void ScaleRowKernel(const float* x, float s, const float* w, float* y,
                    int64_t count) {
  const DF d;
  const size_t n = static_cast<size_t>(count);
  const size_t lanes = hn::Lanes(d);
  const VF vs = hn::Set(d, s);
  size_t i = 0;
  if (w == nullptr) {
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, y + i);
    }
    for (; i < n; ++i) y[i] = x[i] * s;
  } else {
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vs), hn::LoadU(d, w + i)),
                 d, y + i);
    }
    for (; i < n; ++i) y[i] = x[i] * s * w[i];
  }
}

void AxpyKernel(float a, const float* HWY_RESTRICT x, float* HWY_RESTRICT y,
                int64_t count) {
  const DF d;
  const size_t n = static_cast<size_t>(count);
  const size_t lanes = hn::Lanes(d);
  const VF va = hn::Set(d, a);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d,
               y + i);
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

void ScaleKernel(float a, float* y, int64_t count) {
  ScaleRowKernel(y, a, nullptr, y, count);
}

// No HWY_RESTRICT: y may alias a or b.
void AddKernel(const float* a, const float* b, float* y, int64_t count) {
  const DF d;
  const size_t n = static_cast<size_t>(count);
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] = a[i] + b[i];
}

void DotRowsKernel(const float* HWY_RESTRICT q, const float* HWY_RESTRICT rows,
                   int64_t num_rows, int64_t dim, float scale,
                   float* HWY_RESTRICT out) {
  for (int64_t r = 0; r < num_rows; ++r) {
    out[r] = scale * DotKernel(q, rows + r * dim, dim);
  }
}

void WeightedRowSumKernel(const float* HWY_RESTRICT weights,
                          const float* HWY_RESTRICT rows, int64_t num_rows,
                          int64_t dim, float* HWY_RESTRICT out) {
  const DF d;
  const size_t n = static_cast<size_t>(dim);
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  // Column strips held in registers across all rows: one load and store of
  // `out` per strip instead of one per row.
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    VF acc0 = hn::LoadU(d, out + i);
    VF acc1 = hn::LoadU(d, out + i + lanes);
    for (int64_t r = 0; r < num_rows; ++r) {
      const VF w = hn::Set(d, weights[r]);
      const float* row = rows + r * dim + i;
      acc0 = hn::MulAdd(w, hn::LoadU(d, row), acc0);
      acc1 = hn::MulAdd(w, hn::LoadU(d, row + lanes), acc1);
    }
    hn::StoreU(acc0, d, out + i);
    hn::StoreU(acc1, d, out + i + lanes);
  }
  for (; i + lanes <= n; i += lanes) {
    VF acc = hn::LoadU(d, out + i);
    for (int64_t r = 0; r < num_rows; ++r) {
      acc = hn::MulAdd(hn::Set(d, weights[r]), hn::LoadU(d, rows + r * dim + i),
                       acc);
    }
    hn::StoreU(acc, d, out + i);
  }
  for (; i < n; ++i) {
    float acc = out[i];
    for (int64_t r = 0; r < num_rows; ++r)
      acc += weights[r] * rows[r * dim + i];
    out[i] = acc;
  }
}

EngramSums EngramDotKernel(const float* HWY_RESTRICT x,
                           const float* HWY_RESTRICT q,
                           const float* HWY_RESTRICT k,
                           const float* HWY_RESTRICT key, int64_t count) {
  const DF d;
  const size_t n = static_cast<size_t>(count);
  const size_t lanes = hn::Lanes(d);
  VF dot = hn::Zero(d), xx = hn::Zero(d), kk = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VF vx = hn::LoadU(d, x + i);
    const VF vkey = hn::LoadU(d, key + i);
    const VF qk = hn::Mul(hn::LoadU(d, q + i), hn::LoadU(d, k + i));
    dot = hn::MulAdd(hn::Mul(vx, qk), vkey, dot);
    xx = hn::MulAdd(vx, vx, xx);
    kk = hn::MulAdd(vkey, vkey, kk);
  }
  EngramSums sums{.dot = hn::GetLane(hn::SumOfLanes(d, dot)),
                  .xx = hn::GetLane(hn::SumOfLanes(d, xx)),
                  .kk = hn::GetLane(hn::SumOfLanes(d, kk))};
  for (; i < n; ++i) {
    sums.dot += x[i] * (q[i] * k[i]) * key[i];
    sums.xx += x[i] * x[i];
    sums.kk += key[i] * key[i];
  }
  return sums;
}

}  // namespace HWY_NAMESPACE
}  // namespace mneme::gpu::cpu_kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::gpu::cpu_kernels {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(DotKernel);
HWY_EXPORT(SumSquaresKernel);
HWY_EXPORT(ScaleRowKernel);
HWY_EXPORT(AxpyKernel);
HWY_EXPORT(ScaleKernel);
HWY_EXPORT(AddKernel);
HWY_EXPORT(DotRowsKernel);
HWY_EXPORT(WeightedRowSumKernel);
HWY_EXPORT(EngramDotKernel);

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotKernel)(a, b, n);
}

float SumSquares(const float* x, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumSquaresKernel)(x, n);
}

void ScaleRow(const float* x, float s, const float* w, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleRowKernel)(x, s, w, y, n);
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyKernel)(a, x, y, n);
}

void Scale(float a, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleKernel)(a, y, n);
}

void Add(const float* a, const float* b, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddKernel)(a, b, y, n);
}

void DotRows(const float* q, const float* rows, int64_t num_rows, int64_t dim,
             float scale, float* out) {
  HWY_DYNAMIC_DISPATCH(DotRowsKernel)(q, rows, num_rows, dim, scale, out);
}

void WeightedRowSum(const float* weights, const float* rows, int64_t num_rows,
                    int64_t dim, float* out) {
  HWY_DYNAMIC_DISPATCH(WeightedRowSumKernel)
  (weights, rows, num_rows, dim, out);
}

EngramSums EngramDot(const float* x, const float* q, const float* k,
                     const float* key, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(EngramDotKernel)(x, q, k, key, n);
}

const char* SimdTargetName() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
}

}  // namespace mneme::gpu::cpu_kernels
#endif  // HWY_ONCE
