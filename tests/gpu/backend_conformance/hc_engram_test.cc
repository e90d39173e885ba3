// Backend conformance: hyper-connections and the Engram gate on every backend
// of BackendFactories().

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

using HcEngramTest = BackendConformanceTest;

// ---- hyper-connections
// ---------------------------------------------------------

// The official hc_split_sinkhorn (MODEL_V4.md 4.2), written out in double.
TEST_P(HcEngramTest, HcMixAndCollapseMatchTheOfficialSinkhorn) {
  const float eps = 1e-6f;
  for (float norm_eps : {1e-6f, 1e-20f}) {
    for (int hc : {2, 4}) {
      for (int64_t d : {8, 33}) {
        for (int64_t tokens : {1, 3}) {
          for (int iters : {1, 2, 20}) {
            SCOPED_TRACE(testing::Message()
                         << "hc " << hc << " D " << d << " T " << tokens
                         << " iters " << iters);
            const int64_t width = hc * d;
            const int64_t num_mix = static_cast<int64_t>(2 + hc) * hc;
            const std::vector<float> xs = Random(tokens * width, -2, 2);
            const std::vector<float> fn = Random(num_mix * width, -0.2f, 0.2f);
            const std::vector<float> base = Random(num_mix);
            const std::vector<float> scale = Random(3, 0.5f, 1.5f);
            std::vector<double> ref_x(tokens * d, 0.0), ref_post(tokens * hc),
                ref_pre(tokens * hc), ref_comb(tokens * hc * hc);
            for (int64_t t = 0; t < tokens; ++t) {
              double ss = 0;
              for (int64_t i = 0; i < width; ++i) {
                ss += double{xs[t * width + i]} * xs[t * width + i];
              }
              const double norm = 1.0 / std::sqrt(ss / width + norm_eps);
              std::vector<double> mix(num_mix);
              for (int64_t m = 0; m < num_mix; ++m) {
                double dot = 0;
                for (int64_t i = 0; i < width; ++i) {
                  dot += double{xs[t * width + i]} * fn[m * width + i];
                }
                mix[m] = dot * norm;
              }
              for (int h = 0; h < hc; ++h) {
                const double pre =
                    RefSigmoid(mix[h] * scale[0] + base[h]) + eps;
                for (int64_t i = 0; i < d; ++i) {
                  ref_x[t * d + i] += pre * xs[t * width + h * d + i];
                }
                ref_post[t * hc + h] =
                    2 * RefSigmoid(mix[hc + h] * scale[1] + base[hc + h]);
              }
              for (int h = 0; h < hc; ++h) {
                ref_pre[t * hc + h] =
                    RefSigmoid(mix[h] * scale[0] + base[h]) + eps;
              }
              double* comb = &ref_comb[t * hc * hc];
              for (int i = 0; i < hc * hc; ++i) {
                comb[i] =
                    std::exp(mix[2 * hc + i] * scale[2] + base[2 * hc + i]);
              }
              // Softmax per row, + eps, column normalisation; then iters - 1
              // rounds of rows and columns, every sum + eps.
              for (int i = 0; i < hc; ++i) {
                double s = 0;
                for (int j = 0; j < hc; ++j) s += comb[i * hc + j];
                for (int j = 0; j < hc; ++j)
                  comb[i * hc + j] = comb[i * hc + j] / s + eps;
              }
              auto columns = [&] {
                for (int j = 0; j < hc; ++j) {
                  double s = 0;
                  for (int i = 0; i < hc; ++i) s += comb[i * hc + j];
                  for (int i = 0; i < hc; ++i) comb[i * hc + j] /= s + eps;
                }
              };
              columns();
              for (int it = 1; it < iters; ++it) {
                for (int i = 0; i < hc; ++i) {
                  double s = 0;
                  for (int j = 0; j < hc; ++j) s += comb[i * hc + j];
                  for (int j = 0; j < hc; ++j) comb[i * hc + j] /= s + eps;
                }
                columns();
              }
            }
            std::unique_ptr<Weight> fnw = F32Weight(fn, num_mix, width);
            Mat xsm = Upload(xs, tokens, width);
            Mat basem = Upload(base, 1, num_mix), scalem = Upload(scale, 1, 3);
            Mat x = Zeros(tokens, d), pre = Zeros(tokens, hc),
                post = Zeros(tokens, hc),
                comb = Zeros(tokens, static_cast<int64_t>(hc) * hc);
            backend_->HcMix(xsm.view, *fnw, basem.data(), scalem.data(), hc,
                            iters, eps, norm_eps, pre.view, post.view,
                            comb.view);
            backend_->HcCollapse(xsm.view, pre.view, hc, x.view);
            ExpectAllNear(Download(pre), ref_pre, 1e-5);
            ExpectAllNear(Download(x), ref_x, 1e-5);
            ExpectAllNear(Download(post), ref_post, 1e-5);
            std::vector<double> rel_comb = ref_comb;
            const std::vector<float> got_comb = Download(comb);
            for (size_t i = 0; i < rel_comb.size(); ++i) {
              EXPECT_NEAR(got_comb[i], rel_comb[i], 1e-5 * (1 + rel_comb[i]));
            }
            if (iters == 20) {
              for (int64_t t = 0; t < tokens; ++t) {
                for (int i = 0; i < hc; ++i) {
                  double row = 0, col = 0;
                  for (int j = 0; j < hc; ++j) {
                    row += got_comb[t * hc * hc + static_cast<int64_t>(i) * hc +
                                    j];
                    col += got_comb[t * hc * hc + static_cast<int64_t>(j) * hc +
                                    i];
                  }
                  EXPECT_NEAR(row, 1.0, 1e-3);
                  EXPECT_NEAR(col, 1.0, 1e-4);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(HcEngramTest, HcPostMatchesReference) {
  for (int hc : {1, 4}) {
    for (int64_t tokens : {1, 5}) {
      const int64_t d = 19, width = hc * d;
      const std::vector<float> a = Random(tokens * d),
                               post = Random(tokens * hc),
                               comb = Random(tokens * hc * hc),
                               xs = Random(tokens * width);
      std::vector<double> ref(tokens * width);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int j = 0; j < hc; ++j) {
          for (int64_t i = 0; i < d; ++i) {
            double v = double{post[t * hc + j]} * a[t * d + i];
            for (int src = 0; src < hc; ++src) {
              v +=
                  double{
                      comb[t * hc * hc + static_cast<int64_t>(src) * hc + j]} *
                  xs[t * width + src * d + i];
            }
            ref[t * width + j * d + i] = v;
          }
        }
      }
      Mat am = Upload(a, tokens, d), pm = Upload(post, tokens, hc),
          cm = Upload(comb, tokens, static_cast<int64_t>(hc) * hc),
          xm = Upload(xs, tokens, width);
      backend_->HcPost(am.view, pm.view, cm.view, hc, xm.view);
      ExpectAllNear(Download(xm), ref, 1e-5);
    }
  }
}

TEST_P(HcEngramTest, HcHeadMatchesReference) {
  const float eps = 1e-6f;
  for (int hc : {1, 4}) {
    for (int64_t tokens : {1, 6}) {
      const int64_t d = 21, width = hc * d;
      const std::vector<float> xs = Random(tokens * width, -2, 2),
                               fn = Random(hc * width, -0.2f, 0.2f),
                               base = Random(hc), scale = Random(1, 0.5f, 2.0f);
      std::vector<double> ref(tokens * d, 0.0);
      for (int64_t t = 0; t < tokens; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < width; ++i) {
          ss += double{xs[t * width + i]} * xs[t * width + i];
        }
        const double norm = 1.0 / std::sqrt(ss / width + eps);
        for (int h = 0; h < hc; ++h) {
          double dot = 0;
          for (int64_t i = 0; i < width; ++i) {
            dot += double{xs[t * width + i]} * fn[h * width + i];
          }
          const double w = RefSigmoid(dot * norm * scale[0] + base[h]) + eps;
          for (int64_t i = 0; i < d; ++i) {
            ref[t * d + i] += w * xs[t * width + h * d + i];
          }
        }
      }
      std::unique_ptr<Weight> fnw = F32Weight(fn, hc, width);
      Mat xsm = Upload(xs, tokens, width), bm = Upload(base, 1, hc),
          sm = Upload(scale, 1, 1), x = Zeros(tokens, d);
      backend_->HcHead(xsm.view, *fnw, bm.data(), sm.data(), hc, eps, x.view);
      ExpectAllNear(Download(x), ref, 1e-5);
    }
  }
}

// ---- Engram gate
// ---------------------------------------------------------------

// The gate each copy of token 0 received: (new - old) / value.
std::vector<double> GatesOf(const std::vector<float>& before,
                            const std::vector<float>& after,
                            const std::vector<float>& kv, int hc, int64_t d) {
  std::vector<double> gates(hc);
  for (int h = 0; h < hc; ++h) {
    gates[h] = (double{after[h * d]} - before[h * d]) / kv[hc * d];
  }
  return gates;
}

TEST_P(HcEngramTest, EngramGateMatchesReference) {
  const float eps = 1e-6f;
  for (int hc : {1, 4}) {
    for (int64_t d : {16, 33}) {
      const int64_t tokens = 3, width = hc * d;
      const std::vector<float> xs = Random(tokens * width),
                               kv = Random(tokens * (hc + 1) * d),
                               q_w = Random(hc * d, 0.5f, 1.5f),
                               k_w = Random(hc * d, 0.5f, 1.5f);
      std::vector<double> ref(xs.begin(), xs.end());
      for (int64_t t = 0; t < tokens; ++t) {
        for (int h = 0; h < hc; ++h) {
          double dot = 0, xx = 0, kk = 0;
          for (int64_t i = 0; i < d; ++i) {
            const double x = xs[t * width + h * d + i];
            const double key = kv[t * (hc + 1) * d + h * d + i];
            dot += x * q_w[h * d + i] * k_w[h * d + i] * key;
            xx += x * x;
            kk += key * key;
          }
          dot *= 1.0 / std::sqrt(xx / d + eps) / std::sqrt(kk / d + eps) /
                 std::sqrt(static_cast<double>(d));
          const double root = std::sqrt(std::max(std::fabs(dot), 1e-6));
          const double gate = RefSigmoid(dot > 0 ? root : dot < 0 ? -root : 0);
          for (int64_t i = 0; i < d; ++i) {
            ref[t * width + h * d + i] +=
                gate * kv[t * (hc + 1) * d + hc * d + i];
          }
        }
      }
      Mat kvm = Upload(kv, tokens, (hc + 1) * d), qm = Upload(q_w, hc, d),
          km = Upload(k_w, hc, d), xm = Upload(xs, tokens, width);
      backend_->EngramGate(kvm.view, qm.data(), km.data(), hc, eps, xm.view);
      ExpectAllNear(Download(xm), ref, 1e-5);
    }
  }
}

TEST_P(HcEngramTest, EngramGateFollowsTheSignOfTheDot) {
  // Copy 0's key is its x (dot > 0), copy 1's key is -x (dot < 0).
  const int hc = 2;
  const int64_t d = 16;
  const std::vector<float> x = Random(d, 0.1f, 1.0f);
  std::vector<float> xs(hc * d), kv((hc + 1) * d);
  for (int64_t i = 0; i < d; ++i) {
    xs[i] = xs[d + i] = x[i];
    kv[i] = x[i];
    kv[d + i] = -x[i];
    kv[2 * d + i] = 1.0f;  // the value
  }
  const auto gates = [&](float q_value) {
    Mat kvm = Upload(kv, 1, (hc + 1) * d), xm = Upload(xs, 1, hc * d);
    Mat qm = Upload(std::vector<float>(hc * d, q_value), hc, d);
    Mat km = Upload(std::vector<float>(hc * d, 1.0f), hc, d);
    backend_->EngramGate(kvm.view, qm.data(), km.data(), hc, 1e-6f, xm.view);
    return GatesOf(xs, Download(xm), kv, hc, d);
  };
  std::vector<double> g = gates(1.0f);
  EXPECT_GT(g[0], 0.5);
  EXPECT_LT(g[1], 0.5);
  // |dot| = 1e-8 * sqrt(D) < 1e-6: the floor gives sigmoid(+-sqrt(1e-6)).
  g = gates(1e-8f);
  EXPECT_GT(g[0], 0.5);
  EXPECT_LT(g[1], 0.5);
  EXPECT_NEAR(g[0], RefSigmoid(1e-3), 1e-6);
  EXPECT_NEAR(g[1], RefSigmoid(-1e-3), 1e-6);
  // dot == 0: sign 0, gate exactly one half.
  g = gates(0.0f);
  EXPECT_NEAR(g[0], 0.5, 1e-6);
  EXPECT_NEAR(g[1], 0.5, 1e-6);
}

// ---- Engram rows
// --------------------------------------------------------------

// The float a bf16 bit pattern stands for.
float FromBf16Bits(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

TEST_P(HcEngramTest, UnpackBf16RowsPlacesEveryRowByItsColumn) {
  // Three ranks' blocks of a strided split of 7 columns (the last column
  // named by nobody); 7 values a row, so rows straddle the packed floats.
  const int64_t tokens = 5, per_block = 2, blocks = 3, row_dim = 7;
  const int64_t width = 7;
  const std::vector<int32_t> columns = {0, 3, 1, 4, 2, 5};
  const int64_t values = tokens * per_block * row_dim;
  const int64_t block_floats = (values + 1) / 2 + 3;  // With slack.
  std::mt19937 rng(11);
  std::vector<uint16_t> bits(static_cast<size_t>(blocks * block_floats * 2));
  for (uint16_t& b : bits) {
    b = static_cast<uint16_t>(rng() & 0xffff);
    if ((b & 0x7f80) == 0x7f80) b = 0;  // No NaN / inf patterns.
  }
  std::vector<float> packed(static_cast<size_t>(blocks * block_floats));
  std::memcpy(packed.data(), bits.data(), packed.size() * sizeof(float));
  const std::vector<float> before = Random(tokens * width * row_dim);
  std::vector<float> expected = before;
  for (int64_t q = 0; q < blocks; ++q) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < per_block; ++i) {
        for (int64_t k = 0; k < row_dim; ++k) {
          const uint16_t b =
              bits[q * block_floats * 2 + (t * per_block + i) * row_dim + k];
          expected[t * width * row_dim + columns[q * per_block + i] * row_dim +
                   k] = FromBf16Bits(b);
        }
      }
    }
  }
  Mat pm = Upload(packed, blocks, block_floats);
  Mat ym = Upload(before, tokens, width * row_dim);
  backend_->UnpackBf16Rows(pm.data(), block_floats, columns, per_block,
                           static_cast<int>(row_dim), ym.view);
  const std::vector<float> got = Download(ym);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], expected[i]) << "value " << i;
  }
}

// Host staging handed to the ops (StageFromHost): at an offset, copied
// into a buffer or read in place (with no buffer: what ReadsStagingInPlace
// says), then written again for a second round once synchronized.
TEST_P(HcEngramTest, StagedRowsArriveOnceAwaited) {
  const int64_t n = 300;
  absl::StatusOr<std::unique_ptr<HostStaging>> staging =
      backend_->AllocateHostStaging(3 * n);
  ASSERT_TRUE(staging.ok()) << staging.status();
  ASSERT_EQ((*staging)->size(), 3 * n);
  EXPECT_FALSE(backend_->AllocateHostStaging(-1).ok());
  Mat am = Upload(std::vector<float>(n, 0.0f), 1, n);
  Mat bm = Upload(std::vector<float>(n, 0.0f), 1, n);
  Mat sum = Upload(std::vector<float>(n, 0.0f), 1, n);
  for (int round = 0; round < 2; ++round) {
    const std::vector<float> a = Random(n), b = Random(n);
    float* host = (*staging)->data();
    std::fill(host, host + 3 * n, -7.0f);
    std::copy(a.begin(), a.end(), host + n);
    std::copy(b.begin(), b.end(), host + 2 * n);
    const bool in_place = backend_->ReadsStagingInPlace(**staging);
    const float* at_a = backend_->StageFromHost(**staging, n, n,
                                                in_place ? nullptr : am.data());
    const float* at_b = backend_->StageFromHost(**staging, 2 * n, n,
                                                in_place ? nullptr : bm.data());
    // The staging itself, or a copy into the buffer.
    EXPECT_EQ(at_a, in_place ? host + n : am.data());
    EXPECT_EQ(at_b, in_place ? host + 2 * n : bm.data());
    backend_->AwaitStaged();
    backend_->Add(ConstMatrixView(at_a, 1, n), ConstMatrixView(at_b, 1, n),
                  sum.view);
    const std::vector<float> got = Download(sum);
    ASSERT_TRUE(backend_->Synchronize().ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], a[i] + b[i]) << "round " << round << " value " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, HcEngramTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
