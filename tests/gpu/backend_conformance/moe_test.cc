// Backend conformance: MoE routing and experts on every backend of
// BackendFactories().

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_conformance/backend_factories.h"
#include "tests/gpu/backend_conformance/conformance_test_base.h"

namespace mneme::gpu::conformance {
namespace {

using MoeTest = BackendConformanceTest;

// ---- MoE
// ---------------------------------------------------------------------------

double RefScore(float logit) {
  return std::sqrt(std::log1p(std::exp(double{logit})));
}

TEST_P(MoeTest, MoeRouteBreaksTiesByLowerExpertId) {
  const int top_k = 3;
  Mat logits = Upload({0.3f, 0.3f, 0.3f, 0.3f, 0.3f, 0.3f,  // all equal
                       1.0f, 2.0f, 0.0f, 2.0f, 2.0f, -1.0f},
                      2, 6);
  std::vector<int32_t> ids(size_t{2} * top_k);
  std::vector<float> weights(size_t{2} * top_k);
  backend_->MoeRoute(logits.view, nullptr, top_k, 1.5f, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 1, 3, 4}));
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(weights[i], 0.5f, 1e-6);
}

TEST_P(MoeTest, MoeRouteBiasSelectsButDoesNotWeigh) {
  const int64_t tokens = 5, experts = 16;
  const int top_k = 4;
  const float scaling = 2.5f;
  const std::vector<float> logits = Random(tokens * experts, -3, 3);
  std::vector<float> bias(experts, 0.0f);
  bias[13] = 10.0f;  // always chosen, first
  bias[2] = 5.0f;    // always chosen, second
  Mat lm = Upload(logits, tokens, experts), bm = Upload(bias, 1, experts);
  std::vector<int32_t> ids(tokens * top_k), unbiased_ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k), unbiased(tokens * top_k);
  backend_->MoeRoute(lm.view, bm.data(), top_k, scaling, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  backend_->MoeRoute(lm.view, nullptr, top_k, scaling,
                     absl::MakeSpan(unbiased_ids), absl::MakeSpan(unbiased));
  for (int64_t t = 0; t < tokens; ++t) {
    SCOPED_TRACE(t);
    // Reference selection and weights.
    std::vector<int32_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    for (const std::vector<float>* b :
         {&bias, static_cast<std::vector<float>*>(nullptr)}) {
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
        const double bx = RefScore(logits[t * experts + x]) + (b ? (*b)[x] : 0);
        const double by = RefScore(logits[t * experts + y]) + (b ? (*b)[y] : 0);
        return bx > by;
      });
      const std::vector<int32_t>& got = b ? ids : unbiased_ids;
      const std::vector<float>& got_w = b ? weights : unbiased;
      double sum = 0;
      for (int i = 0; i < top_k; ++i)
        sum += RefScore(logits[t * experts + order[i]]);
      double total = 0;
      for (int i = 0; i < top_k; ++i) {
        EXPECT_EQ(got[t * top_k + i], order[i]);
        EXPECT_NEAR(got_w[t * top_k + i],
                    RefScore(logits[t * experts + order[i]]) / sum * scaling,
                    1e-5);
        total += got_w[t * top_k + i];
      }
      EXPECT_NEAR(total, scaling, 1e-5);
      std::iota(order.begin(), order.end(), 0);
    }
    EXPECT_EQ(ids[t * top_k], 13);
    EXPECT_EQ(ids[t * top_k + 1], 2);
  }
}

// V4-Flash's router shape (256 experts, 6 chosen) with logits past the
// softplus cut-over (20; at 100 exp overflows fp32), a NaN (ranked after
// every number) and exact ties at the top, which go to the lower expert id.
TEST_P(MoeTest, MoeRouteAtModelWidthMatchesReference) {
  const int64_t tokens = 3, experts = 256;
  const int top_k = 6;
  const float scaling = 1.5f;
  std::vector<float> logits = Random(tokens * experts, -4, 4);
  logits[0 * experts + 200] = logits[0 * experts + 7] = 9.0f;
  logits[0 * experts + 255] = 30.0f;
  logits[1 * experts + 3] = 100.0f;
  for (int64_t e = 0; e < experts; ++e) logits[2 * experts + e] = 0.25f;
  logits[2 * experts + 128] = 25.0f;
  logits[2 * experts + 0] = std::numeric_limits<float>::quiet_NaN();
  Mat lm = Upload(logits, tokens, experts);
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  backend_->MoeRoute(lm.view, nullptr, top_k, scaling, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  for (int64_t t = 0; t < tokens; ++t) {
    SCOPED_TRACE(t);
    std::vector<int32_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      const double sx = RefScore(logits[t * experts + x]);
      const double sy = RefScore(logits[t * experts + y]);
      if (std::isnan(sx) || std::isnan(sy))
        return !std::isnan(sx) && std::isnan(sy);
      return sx > sy;
    });
    double sum = 0;
    for (int i = 0; i < top_k; ++i) {
      sum += RefScore(logits[t * experts + order[i]]);
    }
    for (int i = 0; i < top_k; ++i) {
      EXPECT_EQ(ids[t * top_k + i], order[i]) << i;
      EXPECT_NEAR(weights[t * top_k + i],
                  RefScore(logits[t * experts + order[i]]) / sum * scaling,
                  1e-5);
    }
  }
  EXPECT_EQ(ids[0], 255);
  EXPECT_EQ(ids[1], 7);
  EXPECT_EQ(ids[2], 200);
  EXPECT_EQ(ids[top_k], 3);
  EXPECT_EQ((std::vector<int32_t>(ids.begin() + int64_t{2} * top_k, ids.end())),
            (std::vector<int32_t>{128, 1, 2, 3, 4, 5}));
  for (float w : weights) EXPECT_TRUE(std::isfinite(w)) << w;
}

// Reference ExpertForward; counts the values each clamp changed.
std::vector<double> RefExpert(const std::vector<float>& x_all, int64_t d,
                              const std::vector<int32_t>& rows,
                              const std::vector<float>& weights,
                              const std::vector<double>& w1,
                              const std::vector<double>& w2,
                              const std::vector<double>& w3, int64_t inter,
                              double limit, const std::vector<float>& y0,
                              int* clamped_high, int* clamped_low) {
  std::vector<double> y(y0.begin(), y0.end());
  for (size_t n = 0; n < rows.size(); ++n) {
    const float* x = &x_all[rows[n] * d];
    std::vector<double> h(inter);
    for (int64_t i = 0; i < inter; ++i) {
      double a = 0, b = 0;
      for (int64_t k = 0; k < d; ++k) {
        a += x[k] * w1[i * d + k];
        b += x[k] * w3[i * d + k];
      }
      if (limit > 0) {
        if (a > limit) ++*clamped_high;
        if (b < -limit) ++*clamped_low;
        a = std::min(a, limit);
        b = std::clamp(b, -limit, limit);
      }
      h[i] = a / (1 + std::exp(-a)) * b;
    }
    for (int64_t k = 0; k < d; ++k) {
      double o = 0;
      for (int64_t i = 0; i < inter; ++i) o += h[i] * w2[k * inter + i];
      y[rows[n] * d + k] += weights[n] * o;
    }
  }
  return y;
}

TEST_P(MoeTest, ExpertForwardClampsAndAccumulates) {
  const int64_t d = 32, inter = 64, n_all = 6;
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(static_cast<int>(format));
    const EncodedWeight w1 = Encode(format, inter, d, rng_);
    const EncodedWeight w2 = Encode(format, d, inter, rng_);
    const EncodedWeight w3 = Encode(format, inter, d, rng_);
    std::unique_ptr<Weight> u1 = MustUpload(w1.host()),
                            u2 = MustUpload(w2.host()),
                            u3 = MustUpload(w3.host());
    ASSERT_TRUE(u1 && u2 && u3);
    const std::vector<float> x_all = Random(n_all * d, -1, 1);
    const std::vector<float> y0 = Random(n_all * d);
    const std::vector<int32_t> rows = {4, 0, 2};
    const std::vector<float> weights = {0.5f, 1.5f, -0.25f};
    Mat xm = Upload(x_all, n_all, d);
    for (float limit : {1.0f, 0.0f, -1.0f}) {
      SCOPED_TRACE(limit);
      int high = 0, low = 0;
      const std::vector<double> ref =
          RefExpert(x_all, d, rows, weights, w1.values, w2.values, w3.values,
                    inter, limit, y0, &high, &low);
      if (limit > 0) {
        EXPECT_GT(high, 0);
        EXPECT_GT(low, 0);
      }
      Mat ym = Upload(y0, n_all, d);
      backend_->ExpertForward(xm.view, rows, weights, *u1, *u2, *u3, limit,
                              ym.view);
      double magnitude = 0;
      for (double v : ref) magnitude = std::max(magnitude, std::fabs(v));
      ExpectAllNear(Download(ym), ref, 1e-5 * magnitude);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MoeTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
