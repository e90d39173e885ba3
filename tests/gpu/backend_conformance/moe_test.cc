// Backend conformance: MoE routing and experts on every backend of
// BackendFactories().

#include <algorithm>
#include <bit>
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
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/cuda/host_executor.h"
#include "gpu/cuda/kernel_backend.h"
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

// A layer's routed experts on this rank: experts[i] is global expert
// first + i; the host values and the uploaded weights.
struct ExpertSet {
  std::vector<EncodedWeight> w1, w2, w3;
  std::vector<std::unique_ptr<Weight>> u1, u2, u3;
  std::vector<ExpertRef> refs;
};

// Assignments of `tokens` tokens, top_k each, to global ids in [-1,
// first + local + 3): -1, other ranks' experts and this rank's. Slot i of
// a token goes to local expert (favourite + i) % local three times in four,
// so that those experts get enough tokens for the tiled Linear.
std::vector<int32_t> Assign(int64_t tokens, int top_k, int64_t first,
                            int64_t local, int64_t favourite,
                            std::mt19937& rng) {
  std::vector<int32_t> ids(tokens * top_k);
  std::uniform_int_distribution<int> any(-1,
                                         static_cast<int>(first + local + 2));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < top_k; ++i) {
      int32_t id = rng() % 4 != 0
                       ? static_cast<int32_t>(first + (favourite + i) % local)
                       : any(rng);
      // A token's experts differ (as MoeRoute's); -1 may repeat.
      for (int j = 0; j < i; ++j) {
        if (id >= 0 && ids[t * top_k + j] == id) id = -1;
      }
      ids[t * top_k + i] = id;
    }
  }
  return ids;
}

// What MoeExperts promises to equal: ExpertForward of each local expert in
// turn with its assignments in order.
void ExpertsOneByOne(Backend& backend, ConstMatrixView x,
                     const std::vector<int32_t>& ids,
                     const std::vector<float>& weights, int top_k,
                     int64_t first, const std::vector<ExpertRef>& experts,
                     float limit, MatrixView y) {
  for (int64_t e = 0; e < std::ssize(experts); ++e) {
    std::vector<int32_t> rows;
    std::vector<float> row_weights;
    for (int64_t a = 0; a < std::ssize(ids); ++a) {
      if (ids[a] != first + e) continue;
      rows.push_back(static_cast<int32_t>(a / top_k));
      row_weights.push_back(weights[a]);
    }
    if (rows.empty()) continue;
    backend.ExpertForward(x, rows, row_weights, *experts[e].w1, *experts[e].w2,
                          *experts[e].w3, limit, y);
  }
}

TEST_P(MoeTest, MoeExpertsSumsTheRanksExpertsOfEachToken) {
  const int64_t first = 3, local = 4, favourite = 2;
  const int top_k = 2;
  struct Shape {
    int64_t d, inter, tokens;
  };
  // Decode-sized (the row op) and prefill-sized (the two favourite experts
  // by tiles on the kernel backends, the others by rows).
  for (const Shape shape : {Shape{32, 64, 5}, Shape{128, 160, 150}}) {
    for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kNvfp4}) {
      SCOPED_TRACE(::testing::Message() << "d " << shape.d << " format "
                                        << static_cast<int>(format));
      const int64_t d = shape.d, inter = shape.inter, tokens = shape.tokens;
      ExpertSet set;
      for (int64_t e = 0; e < local; ++e) {
        set.w1.push_back(Encode(format, inter, d, rng_));
        set.w2.push_back(Encode(format, d, inter, rng_));
        set.w3.push_back(Encode(format, inter, d, rng_));
        set.u1.push_back(MustUpload(set.w1.back().host()));
        set.u2.push_back(MustUpload(set.w2.back().host()));
        set.u3.push_back(MustUpload(set.w3.back().host()));
        ASSERT_TRUE(set.u1.back() && set.u2.back() && set.u3.back());
        set.refs.push_back(ExpertRef{.w1 = set.u1.back().get(),
                                     .w2 = set.u2.back().get(),
                                     .w3 = set.u3.back().get()});
      }
      const std::vector<int32_t> ids =
          Assign(tokens, top_k, first, local, favourite, rng_);
      const std::vector<float> weights = Random(tokens * top_k, -1, 2);
      const std::vector<float> x_all = Random(tokens * d, -1, 1);
      const std::vector<float> y0 = Random(tokens * d);
      const float limit = 1.0f;
      // The reference: each local expert's assignments, in order.
      std::vector<double> ref(y0.begin(), y0.end());
      int64_t favourite_tokens = tokens;
      for (int64_t e = 0; e < local; ++e) {
        std::vector<int32_t> rows;
        std::vector<float> row_weights;
        for (int64_t a = 0; a < tokens * top_k; ++a) {
          if (ids[a] != first + e) continue;
          rows.push_back(static_cast<int32_t>(a / top_k));
          row_weights.push_back(weights[a]);
        }
        if (e == favourite || e == (favourite + 1) % local) {
          favourite_tokens = std::min(favourite_tokens, std::ssize(rows));
        }
        int high = 0, low = 0;
        const std::vector<double> delta =
            RefExpert(x_all, d, rows, row_weights, set.w1[e].values,
                      set.w2[e].values, set.w3[e].values, inter, limit,
                      std::vector<float>(tokens * d, 0.0f), &high, &low);
        for (int64_t i = 0; i < tokens * d; ++i) ref[i] += delta[i];
      }
      if (tokens > 100) {
        EXPECT_GE(favourite_tokens, 64);
      }
      Mat xm = Upload(x_all, tokens, d);
      Mat ym = Upload(y0, tokens, d);
      backend_->MoeExperts(xm.view, ids, weights, top_k, first, set.refs, limit,
                           ym.view);
      double magnitude = 0;
      for (double v : ref) magnitude = std::max(magnitude, std::fabs(v));
      ExpectAllNear(Download(ym), ref, 1e-5 * magnitude);

      // The same additions in the same order as ExpertForward expert by
      // expert: bit for bit.
      Mat one_by_one = Upload(y0, tokens, d);
      ExpertsOneByOne(*backend_, xm.view, ids, weights, top_k, first, set.refs,
                      limit, one_by_one.view);
      ExpectSameBits(Download(ym), Download(one_by_one));
    }
  }
}

TEST_P(MoeTest, MoeExpertsQuantizesEachExpertsActivationsAsExpertForward) {
  // The static W4A4 contract per expert (f32 weights with an input scale):
  // expert 0 takes the activations as they are, 1 and 2 quantized with
  // their own scales.
  const int64_t d = 32, inter = 48, tokens = 40, local = 3;
  const int top_k = 2;
  const float scales[local] = {0.0f, 64.0f, 8.0f};
  std::vector<EncodedWeight> encoded;
  std::vector<std::unique_ptr<Weight>> quantized, plain;
  std::vector<ExpertRef> refs, plain_refs;
  for (int64_t e = 0; e < local; ++e) {
    for (const int64_t rows : {inter, d, inter}) {
      encoded.push_back(
          Encode(WeightFormat::kF32, rows, rows == d ? inter : d, rng_));
      HostWeight host = encoded.back().host();
      plain.push_back(MustUpload(host));
      host.gridbook_input_scale = scales[e];
      quantized.push_back(MustUpload(host));
      ASSERT_TRUE(plain.back() && quantized.back());
    }
    refs.push_back({.w1 = quantized[3 * e].get(),
                    .w2 = quantized[3 * e + 1].get(),
                    .w3 = quantized[3 * e + 2].get()});
    plain_refs.push_back({.w1 = plain[3 * e].get(),
                          .w2 = plain[3 * e + 1].get(),
                          .w3 = plain[3 * e + 2].get()});
  }
  const std::vector<int32_t> ids = Assign(tokens, top_k, 0, local, 1, rng_);
  const std::vector<float> weights = Random(tokens * top_k, 0, 1);
  const std::vector<float> y0(tokens * d, 0.0f);
  Mat xm = Upload(Random(tokens * d, -2, 2), tokens, d);
  Mat grouped = Upload(y0, tokens, d);
  Mat one_by_one = Upload(y0, tokens, d);
  Mat unquantized = Upload(y0, tokens, d);
  backend_->MoeExperts(xm.view, ids, weights, top_k, 0, refs, 0.0f,
                       grouped.view);
  ExpertsOneByOne(*backend_, xm.view, ids, weights, top_k, 0, refs, 0.0f,
                  one_by_one.view);
  backend_->MoeExperts(xm.view, ids, weights, top_k, 0, plain_refs, 0.0f,
                       unquantized.view);
  ExpectSameBits(Download(grouped), Download(one_by_one));
  // The quantization changed something: the contract was applied.
  EXPECT_NE(Download(grouped), Download(unquantized));
}

TEST_P(MoeTest, MoeExpertsWithNoneOfTheRanksExpertsLeavesYAlone) {
  const int64_t d = 32, inter = 32, tokens = 3;
  const EncodedWeight w1 = Encode(WeightFormat::kF32, inter, d, rng_);
  const EncodedWeight w2 = Encode(WeightFormat::kF32, d, inter, rng_);
  std::unique_ptr<Weight> u1 = MustUpload(w1.host()),
                          u2 = MustUpload(w2.host());
  const std::vector<ExpertRef> refs = {
      {.w1 = u1.get(), .w2 = u2.get(), .w3 = u1.get()}};
  // Expert 0 is another rank's (this one holds expert 1); -1 is skipped.
  const std::vector<int32_t> ids = {0, -1, 2, 0, -1, -1};
  const std::vector<float> weights(ids.size(), 1.0f);
  const std::vector<float> y0 = Random(tokens * d);
  Mat xm = Upload(Random(tokens * d), tokens, d);
  Mat ym = Upload(y0, tokens, d);
  backend_->MoeExperts(xm.view, ids, weights, 2, 1, refs, 0.0f, ym.view);
  EXPECT_EQ(Download(ym), y0);
}

// A rank's `local` experts of random weights in `format`; with input
// scales, each weight takes the static W4A4 contract (expert e's scale
// input_scales[e % size], 0: none). Empty refs when an upload failed.
ExpertSet MakeExperts(Backend& backend, WeightFormat format, int64_t local,
                      int64_t d, int64_t inter,
                      const std::vector<float>& input_scales,
                      std::mt19937& rng) {
  ExpertSet set;
  const auto upload = [&](const EncodedWeight& w, int64_t e) {
    HostWeight host = w.host();
    if (!input_scales.empty()) {
      host.gridbook_input_scale = input_scales[e % input_scales.size()];
    }
    absl::StatusOr<std::unique_ptr<Weight>> up = backend.UploadWeight(host);
    return up.ok() ? *std::move(up) : nullptr;
  };
  for (int64_t e = 0; e < local; ++e) {
    set.w1.push_back(Encode(format, inter, d, rng));
    set.w2.push_back(Encode(format, d, inter, rng));
    set.w3.push_back(Encode(format, inter, d, rng));
    set.u1.push_back(upload(set.w1.back(), e));
    set.u2.push_back(upload(set.w2.back(), e));
    set.u3.push_back(upload(set.w3.back(), e));
    if (!set.u1.back() || !set.u2.back() || !set.u3.back()) return {};
    set.refs.push_back(ExpertRef{.w1 = set.u1.back().get(),
                                 .w2 = set.u2.back().get(),
                                 .w3 = set.u3.back().get()});
  }
  return set;
}

// Gate logits [tokens, experts] that, for three tokens in four, put global
// experts `a` and `b` far above the others (so that they take enough
// tokens for the tiled Linear of the kernel backends).
std::vector<float> SkewedLogits(int64_t tokens, int64_t experts, int a, int b,
                                std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> logits(tokens * experts);
  for (float& v : logits) v = u(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    if (rng() % 4 == 0) continue;
    logits[t * experts + a] = 8.0f + u(rng);
    logits[t * experts + b] = 8.0f + u(rng);
  }
  return logits;
}

// The assignments MoeRoute gives each local expert (global first + e).
std::vector<int64_t> LocalCounts(const std::vector<int32_t>& ids, int64_t first,
                                 int64_t local) {
  std::vector<int64_t> counts(local, 0);
  for (const int32_t id : ids) {
    if (id >= first && id < first + local) ++counts[id - first];
  }
  return counts;
}

TEST_P(MoeTest, MoeLayerEqualsMoeRouteThenMoeExperts) {
  const int64_t experts = 12, first = 3, local = 4;
  const int top_k = 2;
  const float scaling = 1.5f, limit = 1.0f;
  struct Shape {
    int64_t d, inter, tokens;
  };
  struct Variant {
    WeightFormat format;
    std::vector<float> input_scales;
  };
  // Decode-sized (the row op) and prefill-sized (experts 4 and 5 by tiles
  // on the kernel backends, the others by rows); the last variant takes
  // the static W4A4 contract on two of the experts.
  const std::vector<Variant> variants = {
      {WeightFormat::kF32, {}},
      {WeightFormat::kNvfp4, {}},
      {WeightFormat::kF32, {0.0f, 32.0f, 0.0f, 8.0f}}};
  // The third: projections of fewer than 128 rows (w1, w3) stay with the
  // row op however many tokens an expert has.
  for (const Shape shape :
       {Shape{32, 64, 5}, Shape{128, 160, 150}, Shape{128, 64, 150}}) {
    for (const Variant& variant : variants) {
      SCOPED_TRACE(::testing::Message()
                   << "d " << shape.d << " format "
                   << static_cast<int>(variant.format) << " scales "
                   << variant.input_scales.size());
      const int64_t d = shape.d, tokens = shape.tokens;
      const ExpertSet set =
          MakeExperts(*backend_, variant.format, local, d, shape.inter,
                      variant.input_scales, rng_);
      ASSERT_EQ(std::ssize(set.refs), local);
      Mat lm =
          Upload(SkewedLogits(tokens, experts, 4, 5, rng_), tokens, experts);
      Mat bias = Upload(Random(experts, -0.5f, 0.5f), 1, experts);
      Mat xm = Upload(Random(tokens * d, -1, 1), tokens, d);
      const std::vector<float> y0 = Random(tokens * d);
      Mat layer = Upload(y0, tokens, d);
      MoeRouting routing;
      routing.top_k = top_k;
      routing.routed_scaling = scaling;
      routing.bias = bias.data();
      backend_->MoeLayer(xm.view, lm.view, routing, first, set.refs, limit,
                         layer.view);

      std::vector<int32_t> ids(tokens * top_k);
      std::vector<float> weights(tokens * top_k);
      backend_->MoeRoute(lm.view, bias.data(), top_k, scaling,
                         absl::MakeSpan(ids), absl::MakeSpan(weights));
      Mat parts = Upload(y0, tokens, d);
      backend_->MoeExperts(xm.view, ids, weights, top_k, first, set.refs, limit,
                           parts.view);
      const std::vector<int64_t> counts = LocalCounts(ids, first, local);
      if (tokens > 100) {
        EXPECT_GE(*std::max_element(counts.begin(), counts.end()), 64);
      }
      EXPECT_GE(std::count_if(counts.begin(), counts.end(),
                              [](int64_t c) { return c > 0; }),
                2);
      // The same additions in the same order: bit for bit.
      const std::vector<float> y = Download(layer);
      ExpectSameBits(y, Download(parts));
      EXPECT_NE(y, y0);
      // Again with the same experts (the kernel backends' kept tables).
      Mat again = Upload(y0, tokens, d);
      backend_->MoeLayer(xm.view, lm.view, routing, first, set.refs, limit,
                         again.view);
      ExpectSameBits(Download(again), y);
    }
  }
}

// Every one of the rank's experts with tokens, the most a decode step's
// launches can need.
TEST_P(MoeTest, MoeLayerGivesEachOfTheRanksExpertsItsTokens) {
  const int64_t experts = 8, first = 4, local = 4, d = 32, inter = 128;
  const int64_t tokens = 4;
  const int top_k = 2;
  const ExpertSet set =
      MakeExperts(*backend_, WeightFormat::kMxfp4, local, d, inter, {}, rng_);
  ASSERT_EQ(std::ssize(set.refs), local);
  // Token t: experts first + t and first + (t + 1) % local.
  std::vector<float> logits(tokens * experts, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    logits[t * experts + first + t] = 6.0f;
    logits[t * experts + first + (t + 1) % local] = 5.0f;
  }
  Mat lm = Upload(logits, tokens, experts);
  Mat xm = Upload(Random(tokens * d), tokens, d);
  const std::vector<float> y0 = Random(tokens * d);
  Mat layer = Upload(y0, tokens, d);
  MoeRouting routing;
  routing.top_k = top_k;
  backend_->MoeLayer(xm.view, lm.view, routing, first, set.refs, 0.0f,
                     layer.view);
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  backend_->MoeRoute(lm.view, nullptr, top_k, 1.0f, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  EXPECT_EQ(LocalCounts(ids, first, local), (std::vector<int64_t>{2, 2, 2, 2}));
  Mat parts = Upload(y0, tokens, d);
  backend_->MoeExperts(xm.view, ids, weights, top_k, first, set.refs, 0.0f,
                       parts.view);
  ExpectSameBits(Download(layer), Download(parts));
}

// Fewer assignments than the rank has experts (one token), and no tokens.
TEST_P(MoeTest, MoeLayerOfOneTokenAndOfNone) {
  const int64_t experts = 8, local = 4, d = 32, inter = 64;
  const int top_k = 2;
  const ExpertSet set =
      MakeExperts(*backend_, WeightFormat::kNvfp4, local, d, inter, {}, rng_);
  ASSERT_EQ(std::ssize(set.refs), local);
  // The token's experts: 5 (this rank's second) and 0 (another rank's).
  std::vector<float> logits(experts, -1.0f);
  logits[5] = 4.0f;
  logits[0] = 3.0f;
  Mat lm = Upload(logits, 1, experts);
  Mat xm = Upload(Random(d), 1, d);
  const std::vector<float> y0 = Random(d);
  Mat layer = Upload(y0, 1, d);
  MoeRouting routing;
  routing.top_k = top_k;
  backend_->MoeLayer(xm.view, lm.view, routing, 4, set.refs, 0.0f, layer.view);
  std::vector<int32_t> ids(top_k);
  std::vector<float> weights(top_k);
  backend_->MoeRoute(lm.view, nullptr, top_k, 1.0f, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 0}));
  Mat parts = Upload(y0, 1, d);
  backend_->MoeExperts(xm.view, ids, weights, top_k, 4, set.refs, 0.0f,
                       parts.view);
  ExpectSameBits(Download(layer), Download(parts));
  EXPECT_NE(Download(layer), y0);
  // No tokens: nothing to do.
  backend_->MoeLayer(ConstMatrixView(xm.data(), 0, d),
                     ConstMatrixView(lm.data(), 0, experts), routing, 4,
                     set.refs, 0.0f, MatrixView{layer.data(), 0, d});
  ExpectSameBits(Download(layer), Download(parts));
}

TEST_P(MoeTest, MoeLayerWithNoneOfTheRanksExpertsLeavesYAlone) {
  const int64_t experts = 12, local = 4, d = 32, inter = 32, tokens = 7;
  const ExpertSet set =
      MakeExperts(*backend_, WeightFormat::kF32, local, d, inter, {}, rng_);
  ASSERT_EQ(std::ssize(set.refs), local);
  // Every token's two experts are 0 and 1; this rank holds 8 .. 11.
  std::vector<float> logits(tokens * experts, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    logits[t * experts] = logits[t * experts + 1] = 5.0f;
  }
  Mat lm = Upload(logits, tokens, experts);
  Mat xm = Upload(Random(tokens * d), tokens, d);
  const std::vector<float> y0 = Random(tokens * d);
  Mat ym = Upload(y0, tokens, d);
  MoeRouting routing;
  routing.top_k = 2;
  backend_->MoeLayer(xm.view, lm.view, routing, 8, set.refs, 0.0f, ym.view);
  EXPECT_EQ(Download(ym), y0);
}

// V4's hash layers: each token's experts come from its id (listed), some
// listed twice; the weights are the listings' scores normalised over all
// of them.
TEST_P(MoeTest, MoeLayerHashRoutesTheListedExperts) {
  const int64_t experts = 8, first = 2, local = 4, d = 128, inter = 128;
  const int64_t tokens = 70;
  const int top_k = 3;
  const float scaling = 2.0f;
  const ExpertSet set =
      MakeExperts(*backend_, WeightFormat::kF32, local, d, inter, {}, rng_);
  ASSERT_EQ(std::ssize(set.refs), local);
  // Slot 0 is expert 3 for every token (70 tokens: tiles on the kernel
  // backends); slot 2 repeats slot 1 for every third token.
  std::vector<int32_t> listed(tokens * top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    listed[t * top_k] = 3;
    listed[t * top_k + 1] = static_cast<int32_t>(rng_() % experts);
    listed[t * top_k + 2] = t % 3 == 0 ? listed[t * top_k + 1]
                                       : static_cast<int32_t>(rng_() % experts);
  }
  std::vector<float> logits = Random(tokens * experts, -4, 4);
  // Past the softplus cut-over (20) for some listings.
  for (int64_t t = 0; t < tokens; t += 5) logits[t * experts + 3] = 25.0f;
  const std::vector<float> x = Random(tokens * d, -1, 1);
  const std::vector<float> y0 = Random(tokens * d);
  // The reference: each listing's weight in double, a repeated listing
  // added once.
  std::vector<double> ref(y0.begin(), y0.end());
  int repeats = 0;
  for (int64_t e = 0; e < local; ++e) {
    std::vector<int32_t> rows;
    std::vector<float> row_weights;
    for (int64_t t = 0; t < tokens; ++t) {
      double sum = 0;
      for (int i = 0; i < top_k; ++i) {
        sum += RefScore(logits[t * experts + listed[t * top_k + i]]);
      }
      for (int i = 0; i < top_k; ++i) {
        const int32_t id = listed[t * top_k + i];
        const bool repeated = std::find(listed.begin() + t * top_k,
                                        listed.begin() + t * top_k + i,
                                        id) != listed.begin() + t * top_k + i;
        repeats += repeated && e == 0 ? 1 : 0;
        if (repeated || id != first + e) continue;
        rows.push_back(static_cast<int32_t>(t));
        row_weights.push_back(static_cast<float>(
            RefScore(logits[t * experts + id]) / sum * scaling));
      }
    }
    int high = 0, low = 0;
    const std::vector<double> delta =
        RefExpert(x, d, rows, row_weights, set.w1[e].values, set.w2[e].values,
                  set.w3[e].values, inter, 0.0,
                  std::vector<float>(tokens * d, 0.0f), &high, &low);
    for (int64_t i = 0; i < tokens * d; ++i) ref[i] += delta[i];
  }
  EXPECT_GT(repeats, 0);
  Mat lm = Upload(logits, tokens, experts);
  Mat xm = Upload(x, tokens, d);
  Mat ym = Upload(y0, tokens, d);
  MoeRouting routing;
  routing.top_k = top_k;
  routing.routed_scaling = scaling;
  routing.hash_experts = listed;
  backend_->MoeLayer(xm.view, lm.view, routing, first, set.refs, 0.0f, ym.view);
  double magnitude = 0;
  for (double v : ref) magnitude = std::max(magnitude, std::fabs(v));
  ExpectAllNear(Download(ym), ref, 1e-5 * magnitude);
}

INSTANTIATE_TEST_SUITE_P(Backends, MoeTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

// The kernel backend keeps each set of experts' group tables: sets used in
// turn, a set whose weights were freed and a new set uploaded after it
// (whose weights may sit at the old addresses) each take their own, within
// a budget that holds them all and one that holds one set at a time.
TEST(KernelBackendMoeTest, KeepsEachExpertSetsTables) {
  const int64_t experts = 6, local = 3, d = 32, inter = 64, tokens = 9;
  const int top_k = 2;
  for (const int64_t budget : {int64_t{64} << 20, int64_t{1}}) {
    SCOPED_TRACE(budget);
    KernelBackend::Options options;
    options.expert_table_bytes = budget;
    KernelBackend backend(MakeHostExecutor(), options);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto upload = [&](int64_t n) {
      std::vector<float> host(n);
      for (float& v : host) v = u(rng);
      absl::StatusOr<std::unique_ptr<Buffer>> b = backend.Allocate(n);
      CHECK(b.ok()) << b.status();
      backend.CopyFromHost(host, (*b)->data());
      return *std::move(b);
    };
    const std::unique_ptr<Buffer> x = upload(tokens * d);
    const std::unique_ptr<Buffer> logits = upload(tokens * experts);
    const ConstMatrixView xv(x->data(), tokens, d);
    const ConstMatrixView lv(logits->data(), tokens, experts);
    MoeRouting routing;
    routing.top_k = top_k;
    std::vector<int32_t> ids(tokens * top_k);
    std::vector<float> weights(tokens * top_k);
    backend.MoeRoute(lv, nullptr, top_k, 1.0f, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
    // MoeLayer over `set`, bit for bit as MoeRoute then MoeExperts.
    const auto check = [&](const ExpertSet& set) {
      const std::unique_ptr<Buffer> y1 = upload(tokens * d);
      std::vector<float> y0(tokens * d);
      backend.CopyToHost(y1->data(), absl::MakeSpan(y0));
      const std::unique_ptr<Buffer> y2 = upload(tokens * d);
      backend.CopyFromHost(y0, y2->data());
      backend.MoeLayer(xv, lv, routing, 1, set.refs, 0.0f,
                       MatrixView{y1->data(), tokens, d});
      backend.MoeExperts(xv, ids, weights, top_k, 1, set.refs, 0.0f,
                         MatrixView{y2->data(), tokens, d});
      std::vector<float> a(tokens * d), b(tokens * d);
      backend.CopyToHost(y1->data(), absl::MakeSpan(a));
      backend.CopyToHost(y2->data(), absl::MakeSpan(b));
      ExpectSameBits(a, b);
      EXPECT_NE(a, y0);
    };
    auto first = std::make_unique<ExpertSet>(
        MakeExperts(backend, WeightFormat::kF32, local, d, inter, {}, rng));
    const ExpertSet second =
        MakeExperts(backend, WeightFormat::kF32, local, d, inter, {}, rng);
    ASSERT_EQ(std::ssize(first->refs), local);
    ASSERT_EQ(std::ssize(second.refs), local);
    for (const ExpertSet* set : std::vector<const ExpertSet*>{
             first.get(), &second, first.get(), &second}) {
      check(*set);
    }
    first.reset();
    const ExpertSet third =
        MakeExperts(backend, WeightFormat::kF32, local, d, inter, {}, rng);
    ASSERT_EQ(std::ssize(third.refs), local);
    check(third);
    check(second);
  }
}

}  // namespace
}  // namespace mneme::gpu::conformance
