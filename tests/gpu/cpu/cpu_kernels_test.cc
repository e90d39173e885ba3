#include "gpu/cpu/cpu_kernels.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/testing/hwy_targets.h"

namespace mneme::gpu::cpu_kernels {
namespace {

// Sizes around every SIMD width (1 to 16 fp32 lanes: SSE/NEON to AVX-512 and
// 512-bit SVE) and around the 4-vector unrolled loops (up to 64 floats).
constexpr int64_t kSizes[] = {0,  1,  3,  4,  7,   8,   15,  16,  17,  31,
                              33, 63, 64, 65, 127, 128, 129, 130, 255, 257};

std::vector<float> Random(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The worst-case rounding error of an fp32 sum of n products whose absolute
// values sum to abs_sum (n unit roundoffs of the magnitude), plus the rounding
// of the products themselves. A skipped or repeated element is O(0.1) here.
double Tolerance(int64_t n, double abs_sum) {
  return (static_cast<double>(n) + 2) * 0x1p-24 * abs_sum + 1e-7;
}

// Every test runs once per Highway target this CPU supports (forced through
// SetSupportedTargetsForTest), so one run covers e.g. SSE4, AVX2 and AVX-512
// here and NEON, SVE and SVE2 under the Arm suites (tests/arm).
class CpuKernelsTest : public ::mneme::testing::HwyTargetTest {};

TEST_P(CpuKernelsTest, DispatchesToTheForcedTarget) {
  EXPECT_STREQ(SimdTargetName(), hwy::TargetName(GetParam()));
}

TEST_P(CpuKernelsTest, ReductionsMatchDoubleLoops) {
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> a = Random(rng, n), b = Random(rng, n),
                             c = Random(rng, n), e = Random(rng, n);
    double dot = 0, ss = 0, engram = 0, ee = 0;
    double dot_abs = 0, engram_abs = 0;
    for (int64_t i = 0; i < n; ++i) {
      dot += double{a[i]} * b[i];
      dot_abs += std::abs(double{a[i]} * b[i]);
      ss += double{a[i]} * a[i];
      engram += double{a[i]} * b[i] * c[i] * e[i];
      engram_abs += std::abs(double{a[i]} * b[i] * c[i] * e[i]);
      ee += double{e[i]} * e[i];
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), n), dot, Tolerance(n, dot_abs));
    EXPECT_NEAR(SumSquares(a.data(), n), ss, Tolerance(n, ss));
    const EngramSums sums =
        EngramDot(a.data(), b.data(), c.data(), e.data(), n);
    EXPECT_NEAR(sums.dot, engram, Tolerance(n, engram_abs));
    EXPECT_NEAR(sums.xx, ss, Tolerance(n, ss));
    EXPECT_NEAR(sums.kk, ee, Tolerance(n, ee));
  }
}

TEST_P(CpuKernelsTest, ElementwiseMatchScalarLoops) {
  std::mt19937 rng(2);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> x = Random(rng, n), w = Random(rng, n),
                             y0 = Random(rng, n);
    std::vector<float> y(n);
    ScaleRow(x.data(), 0.5f, nullptr, y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], x[i] * 0.5f);
    ScaleRow(x.data(), 0.5f, w.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], x[i] * 0.5f * w[i]);
    std::vector<float> alias = x;  // y == x
    ScaleRow(alias.data(), 2.0f, w.data(), alias.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(alias[i], x[i] * 2 * w[i]);
    y = y0;
    Axpy(-1.5f, x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(y[i], y0[i] - 1.5f * x[i], 1e-6);
    y = y0;
    Scale(3.0f, y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], y0[i] * 3.0f);
    alias = x;
    Add(alias.data(), w.data(), alias.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(alias[i], x[i] + w[i]);
  }
}

TEST_P(CpuKernelsTest, RowKernelsMatchScalarLoops) {
  std::mt19937 rng(3);
  for (int64_t dim : kSizes) {
    for (int64_t rows : {0, 1, 5}) {
      SCOPED_TRACE(::testing::Message() << dim << " x " << rows);
      const std::vector<float> q = Random(rng, dim),
                               m = Random(rng, rows * dim),
                               weights = Random(rng, rows),
                               out0 = Random(rng, dim);
      std::vector<float> scores(rows);
      DotRows(q.data(), m.data(), rows, dim, 0.25f, scores.data());
      std::vector<float> out = out0;
      WeightedRowSum(weights.data(), m.data(), rows, dim, out.data());
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0, ref_abs = 0;
        for (int64_t i = 0; i < dim; ++i) {
          ref += double{q[i]} * m[r * dim + i];
          ref_abs += std::abs(double{q[i]} * m[r * dim + i]);
        }
        EXPECT_NEAR(scores[r], 0.25 * ref, 0.25 * Tolerance(dim, ref_abs));
      }
      for (int64_t i = 0; i < dim; ++i) {
        double ref = out0[i];
        for (int64_t r = 0; r < rows; ++r)
          ref += double{weights[r]} * m[r * dim + i];
        EXPECT_NEAR(out[i], ref, 1e-5);
      }
    }
  }
}

MNEME_INSTANTIATE_HWY_TARGETS(CpuKernelsTest);

}  // namespace
}  // namespace mneme::gpu::cpu_kernels
