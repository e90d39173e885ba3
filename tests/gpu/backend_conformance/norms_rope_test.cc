// Backend conformance: RmsNorm, Rope, copies and Embedding on every backend of
// BackendFactories().

#include <algorithm>
#include <cmath>
#include <cstddef>
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

using NormsRopeTest = BackendConformanceTest;

// ---- RmsNorm, Rope, copies
// ---------------------------------------------------

TEST_P(NormsRopeTest, RmsNormMatchesReference) {
  const float eps = 1e-6f;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {1, 7},
                            {3, 64},
                            {17, 1000},
                            {5, 33}}) {
    for (bool with_weight : {false, true}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << rows << "x" << cols << " weight " << with_weight
                     << " alias " << in_place);
        const std::vector<float> x = Random(rows * cols, -3, 3);
        const std::vector<float> weight = Random(cols);
        std::vector<double> ref(rows * cols);
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t c = 0; c < cols; ++c) {
            ss += double{x[r * cols + c]} * x[r * cols + c];
          }
          const double inv = 1.0 / std::sqrt(ss / cols + eps);
          for (int64_t c = 0; c < cols; ++c) {
            ref[r * cols + c] =
                x[r * cols + c] * inv * (with_weight ? weight[c] : 1.0);
          }
        }
        Mat xm = Upload(x, rows, cols);
        Mat wm = Upload(weight, 1, cols);
        Mat ym = in_place ? Mat{nullptr, xm.view} : Zeros(rows, cols);
        backend_->RmsNorm(xm.view, with_weight ? wm.data() : nullptr, eps,
                          ym.view);
        ExpectAllNear(in_place ? Download(xm) : Download(ym), ref, 1e-5);
      }
    }
  }
}

TEST_P(NormsRopeTest, RopeMatchesReferenceAndInverts) {
  struct Case {
    int64_t tokens;
    int heads, head_dim, rope_dim;
  };
  for (const Case& c : {Case{1, 1, 8, 8}, Case{5, 3, 10, 4}, Case{4, 8, 64, 16},
                        Case{2, 2, 6, 0}}) {
    SCOPED_TRACE(testing::Message() << c.tokens << " " << c.heads << " "
                                    << c.head_dim << " " << c.rope_dim);
    const float theta = 10000.0f;
    const int64_t cols = static_cast<int64_t>(c.heads) * c.head_dim;
    const std::vector<float> x = Random(c.tokens * cols);
    std::vector<int32_t> positions(c.tokens);
    std::uniform_int_distribution<int32_t> pos(0, 100000);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = 0;
    std::vector<double> ref(x.begin(), x.end());
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        for (int i = 0; i < c.rope_dim / 2; ++i) {
          const double angle =
              positions[t] * std::pow(double{theta}, -2.0 * i / c.rope_dim);
          const int64_t at = t * cols + static_cast<int64_t>(h) * c.head_dim +
                             c.head_dim - c.rope_dim + int64_t{2} * i;
          const double a = x[at], b = x[at + 1];
          ref[at] = a * std::cos(angle) - b * std::sin(angle);
          ref[at + 1] = a * std::sin(angle) + b * std::cos(angle);
        }
      }
    }
    Mat xm = Upload(x, c.tokens, cols);
    const std::vector<double> freqs = RopeInverseFrequencies(theta, c.rope_dim);
    backend_->Rope(xm.view, c.head_dim, c.rope_dim, freqs, positions,
                   Backend::RopeDirection::kForward);
    ExpectAllNear(Download(xm), ref, 1e-5);
    backend_->Rope(xm.view, c.head_dim, c.rope_dim, freqs, positions,
                   Backend::RopeDirection::kInverse);
    ExpectAllNear(Download(xm), std::vector<double>(x.begin(), x.end()), 1e-5);
  }
}

TEST_P(NormsRopeTest, AddAndRowCopies) {
  const std::vector<float> a = Random(int64_t{5} * 9),
                           b = Random(int64_t{5} * 9);
  Mat am = Upload(a, 5, 9), bm = Upload(b, 5, 9), ym = Zeros(5, 9);
  backend_->Add(am.view, bm.view, ym.view);
  std::vector<double> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = double{a[i]} + b[i];
  ExpectAllNear(Download(ym), sum, 1e-6);
  backend_->Add(am.view, bm.view, am.view);  // y aliases a
  ExpectAllNear(Download(am), sum, 1e-6);

  // Columns [2, 6) of b.
  Mat cols = Zeros(5, 4);
  backend_->CopyColumns(bm.view, 2, cols.view);
  const std::vector<float> got = Download(cols);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(got[r * 4 + c], b[r * 9 + 2 + c]);
  }

  const std::vector<int32_t> rows = {4, 0, 4};
  Mat gathered = Zeros(3, 9);
  backend_->GatherRows(bm.view, rows, gathered.view);
  const std::vector<float> g = Download(gathered);
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 9; ++c) EXPECT_EQ(g[i * 9 + c], b[rows[i] * 9 + c]);
  }
  const std::vector<float> src = Random(int64_t{2} * 9);
  Mat srcm = Upload(src, 2, 9);
  Mat target = Upload(b, 5, 9);
  const std::vector<int32_t> to = {3, 1};
  backend_->ScatterRows(srcm.view, to, target.view);
  std::vector<float> expected = b;
  std::copy_n(src.begin(), 9, expected.begin() + std::ptrdiff_t{3} * 9);
  std::copy_n(src.begin() + 9, 9, expected.begin() + std::ptrdiff_t{1} * 9);
  EXPECT_EQ(Download(target), expected);
}

TEST_P(NormsRopeTest, EmbeddingZerosIdsOutsideTheShard) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kF32}) {
    const EncodedWeight e = Encode(format, 5, 12, rng_);
    std::unique_ptr<Weight> table = MustUpload(e.host());
    ASSERT_NE(table, nullptr);
    const std::vector<int32_t> ids = {10, 14, 9, 15, -3, 12};
    Mat y = Upload(std::vector<float>(size_t{6} * 12, 7.0f), 6, 12);
    backend_->Embedding(ids, /*first_id=*/10, *table, y.view);
    const std::vector<float> got = Download(y);
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t row = ids[t] - 10;
      for (int c = 0; c < 12; ++c) {
        const double expected =
            row >= 0 && row < 5 ? e.values[row * 12 + c] : 0.0;
        EXPECT_EQ(got[t * 12 + c], expected) << "token " << t;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, NormsRopeTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
