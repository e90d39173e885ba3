#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/types/span.h"
#include "formats/bf16.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/backend_checks.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cpu/cpu_backend_internal.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/sampling.h"

namespace mneme::gpu {
namespace {

namespace k = cpu_kernels;
using cpu_backend_internal::AsCpu;
using cpu_backend_internal::CpuWeight;
using cpu_backend_internal::Grain;
using cpu_backend_internal::Rsqrt;
using cpu_backend_internal::Sigmoid;

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void CpuBackend::HcMix(ConstMatrixView x_stream, const Weight& fn,
                       const float* base, const float* scale, int hc,
                       int sinkhorn_iters, float hc_eps, float norm_eps,
                       MatrixView pre, MatrixView post, MatrixView comb) {
  const CpuWeight& weight = AsCpu(fn);
  CheckHcMixShapes(x_stream, weight.rows(), weight.cols(), hc, sinkhorn_iters,
                   pre, post, comb);
  const int64_t tokens = x_stream.rows;
  const int64_t width = x_stream.cols;
  const int64_t num_mix = int64_t{2 + hc} * hc;
  if (tokens == 0) return;
  std::vector<float> mix(tokens * num_mix);
  Gemm(x_stream.data, tokens, weight, mix.data(), Accumulate::kNo);
  pool_.ParallelFor(tokens, Grain(3 * width), [&](int64_t begin, int64_t end) {
    std::vector<double> c(static_cast<size_t>(hc) * hc);
    for (int64_t t = begin; t < end; ++t) {
      const float* stream = x_stream.data + t * width;
      const double norm =
          1.0 / std::sqrt(static_cast<double>(k::SumSquares(stream, width)) /
                              static_cast<double>(width) +
                          norm_eps);
      const float* m = mix.data() + t * num_mix;
      for (int h = 0; h < hc; ++h) {
        pre.data[t * hc + h] =
            Sigmoid(static_cast<float>(m[h] * norm) * scale[0] + base[h]) +
            hc_eps;
        post.data[t * hc + h] =
            2.0f * Sigmoid(static_cast<float>(m[hc + h] * norm) * scale[1] +
                           base[hc + h]);
      }
      for (int i = 0; i < hc * hc; ++i) {
        c[i] = static_cast<double>(static_cast<float>(m[2 * hc + i] * norm) *
                                       scale[2] +
                                   base[2 * hc + i]);
      }
      // Softmax over each row, + eps, then the column normalisation.
      for (int i = 0; i < hc; ++i) {
        double row_max = c[static_cast<size_t>(i) * hc];
        for (int j = 1; j < hc; ++j) row_max = std::max(row_max, c[i * hc + j]);
        double sum = 0.0;
        for (int j = 0; j < hc; ++j) {
          c[i * hc + j] = std::exp(c[i * hc + j] - row_max);
          sum += c[i * hc + j];
        }
        for (int j = 0; j < hc; ++j)
          c[i * hc + j] = c[i * hc + j] / sum + hc_eps;
      }
      auto normalise_columns = [&] {
        for (int j = 0; j < hc; ++j) {
          double sum = 0.0;
          for (int i = 0; i < hc; ++i) sum += c[i * hc + j];
          for (int i = 0; i < hc; ++i) c[i * hc + j] /= sum + hc_eps;
        }
      };
      normalise_columns();
      for (int iter = 1; iter < sinkhorn_iters; ++iter) {
        for (int i = 0; i < hc; ++i) {
          double sum = 0.0;
          for (int j = 0; j < hc; ++j) sum += c[i * hc + j];
          for (int j = 0; j < hc; ++j) c[i * hc + j] /= sum + hc_eps;
        }
        normalise_columns();
      }
      for (int i = 0; i < hc * hc; ++i) {
        comb.data[t * hc * hc + i] = static_cast<float>(c[i]);
      }
    }
  });
}

void CpuBackend::HcCollapse(ConstMatrixView x_stream, ConstMatrixView pre,
                            int hc, MatrixView x) {
  CheckHcCollapseShapes(x_stream, pre, hc, x);
  const int64_t tokens = x_stream.rows;
  const int64_t d = x.cols;
  pool_.ParallelFor(tokens, Grain(int64_t{2} * hc * d),
                    [&](int64_t begin, int64_t end) {
                      for (int64_t t = begin; t < end; ++t) {
                        float* x_row = x.data + t * d;
                        std::fill(x_row, x_row + d, 0.0f);
                        for (int h = 0; h < hc; ++h) {
                          k::Axpy(pre.data[t * hc + h],
                                  x_stream.data + t * hc * d + h * d, x_row, d);
                        }
                      }
                    });
}

void CpuBackend::HcPost(ConstMatrixView a, ConstMatrixView post,
                        ConstMatrixView comb, int hc, MatrixView x_stream) {
  CheckHcPostShapes(a, post, comb, hc, x_stream);
  const int64_t tokens = x_stream.rows;
  const int64_t d = a.cols;
  const int64_t width = hc * d;
  pool_.ParallelFor(
      tokens, Grain(int64_t{2} * hc * width), [&](int64_t begin, int64_t end) {
        std::vector<float> old(width);
        for (int64_t t = begin; t < end; ++t) {
          float* stream = x_stream.data + t * width;
          std::copy(stream, stream + width, old.begin());
          const float* c = comb.data + t * hc * hc;
          for (int j = 0; j < hc; ++j) {
            float* dst = stream + j * d;
            k::ScaleRow(a.data + t * d, post.data[t * hc + j], nullptr, dst, d);
            for (int i = 0; i < hc; ++i) {
              k::Axpy(c[i * hc + j], old.data() + i * d, dst, d);
            }
          }
        }
      });
}

void CpuBackend::HcHead(ConstMatrixView x_stream, const Weight& fn,
                        const float* base, const float* scale, int hc,
                        float eps, MatrixView x) {
  const CpuWeight& weight = AsCpu(fn);
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  const int64_t d = x.cols;
  const int64_t width = hc * d;
  CHECK_EQ(x_stream.cols, width);
  CHECK_EQ(x.rows, tokens);
  CHECK_EQ(weight.rows(), hc);
  CHECK_EQ(weight.cols(), width);
  if (tokens == 0) return;
  std::vector<float> mix(tokens * hc);
  Gemm(x_stream.data, tokens, weight, mix.data(), Accumulate::kNo);
  pool_.ParallelFor(tokens, Grain(2 * width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* stream = x_stream.data + t * width;
      const float norm =
          Rsqrt(k::SumSquares(stream, width) / static_cast<float>(width) + eps);
      float* x_row = x.data + t * d;
      std::fill(x_row, x_row + d, 0.0f);
      for (int h = 0; h < hc; ++h) {
        const float w =
            Sigmoid(mix[t * hc + h] * norm * scale[0] + base[h]) + eps;
        k::Axpy(w, stream + h * d, x_row, d);
      }
    }
  });
}

void CpuBackend::UnpackBf16Rows(const float* packed, int64_t block_floats,
                                absl::Span<const int32_t> columns,
                                int64_t cols_per_block, int row_dim,
                                MatrixView y) {
  const int64_t blocks = CheckUnpackBf16RowsShapes(block_floats, columns,
                                                   cols_per_block, row_dim, y);
  const int64_t rows = y.rows * cols_per_block;
  pool_.ParallelFor(
      blocks * rows, Grain(row_dim), [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t q = item / rows;
          const int64_t r = item % rows;
          const int64_t t = r / cols_per_block;
          const int64_t i = r % cols_per_block;
          const auto* src =
              reinterpret_cast<const uint16_t*>(packed + q * block_floats) +
              r * row_dim;
          float* dst = y.data + t * y.cols +
                       int64_t{columns[q * cols_per_block + i]} * row_dim;
          for (int k = 0; k < row_dim; ++k)
            dst[k] = formats::Bf16ToFloat(src[k]);
        }
      });
}

void CpuBackend::EngramGate(ConstMatrixView kv, const float* q_w,
                            const float* k_w, int hc, float eps,
                            MatrixView x_stream) {
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  CHECK_EQ(x_stream.cols % hc, 0);
  const int64_t d = x_stream.cols / hc;
  CHECK_EQ(kv.rows, tokens);
  CHECK_EQ(kv.cols, (hc + 1) * d);
  if (d == 0) return;
  const float inv_d = 1.0f / static_cast<float>(d);
  const float inv_sqrt_d = Rsqrt(static_cast<float>(d));
  pool_.ParallelFor(tokens * hc, Grain(6 * d), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / hc;
      const int64_t h = item % hc;
      float* x_h = x_stream.data + t * x_stream.cols + h * d;
      const float* kv_row = kv.data + t * kv.cols;
      const k::EngramSums sums =
          k::EngramDot(x_h, q_w + h * d, k_w + h * d, kv_row + h * d, d);
      const float dot = sums.dot * Rsqrt(sums.xx * inv_d + eps) *
                        Rsqrt(sums.kk * inv_d + eps) * inv_sqrt_d;
      const float magnitude = std::sqrt(std::max(std::fabs(dot), 1e-6f));
      const float signed_root = dot > 0.0f   ? magnitude
                                : dot < 0.0f ? -magnitude
                                             : 0.0f;
      k::Axpy(Sigmoid(signed_root), kv_row + hc * d, x_h, d);
    }
  });
}

void CpuBackend::MoeRoute(ConstMatrixView logits, const float* bias, int top_k,
                          float routed_scaling, absl::Span<int32_t> expert_ids,
                          absl::Span<float> weights) {
  CheckMoeRouteShapes(logits, top_k, expert_ids, weights);
  const int64_t tokens = logits.rows;
  const int64_t experts = logits.cols;
  pool_.ParallelFor(
      tokens, Grain(experts * 40), [&](int64_t begin, int64_t end) {
        MoeRouter router;
        for (int64_t t = begin; t < end; ++t) {
          router.Route(logits.data + t * experts, experts, bias, top_k,
                       routed_scaling, expert_ids.data() + t * top_k,
                       weights.data() + t * top_k);
        }
      });
}

void CpuBackend::ExpertForward(ConstMatrixView x_all,
                               absl::Span<const int32_t> rows,
                               absl::Span<const float> weights,
                               const Weight& w1, const Weight& w2,
                               const Weight& w3, float limit,
                               MatrixView y_all) {
  const CpuWeight& up1 = AsCpu(w1);
  const CpuWeight& down = AsCpu(w2);
  const CpuWeight& up3 = AsCpu(w3);
  CheckExpertForwardShapes(x_all, rows, weights, w1, w2, w3, y_all);
  const int64_t d = x_all.cols;
  const int64_t inter = up1.rows();
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  std::vector<float> x(n * d);
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(x_all.data + int64_t{rows[i]} * d, d, x.data() + i * d);
  }
  std::vector<float> h1(n * inter), h3(n * inter);
  Gemm(x.data(), n, up1, h1.data(), Accumulate::kNo);
  Gemm(x.data(), n, up3, h3.data(), Accumulate::kNo);
  const bool clamp = limit > 0.0f;
  for (int64_t i = 0; i < n * inter; ++i) {
    float a = h1[i];
    float b = h3[i];
    if (clamp) {
      a = std::min(a, limit);
      b = std::clamp(b, -limit, limit);
    }
    h1[i] = Silu(a) * b;
  }
  std::vector<float> out(n * d);
  Gemm(h1.data(), n, down, out.data(), Accumulate::kNo);
  // Sequential: rows may repeat.
  for (int64_t i = 0; i < n; ++i) {
    k::Axpy(weights[i], out.data() + i * d, y_all.data + int64_t{rows[i]} * d,
            d);
  }
}

void CpuBackend::MoeExperts(ConstMatrixView x_all,
                            absl::Span<const int32_t> expert_ids,
                            absl::Span<const float> weights, int top_k,
                            int64_t first_expert,
                            absl::Span<const ExpertRef> experts, float limit,
                            MatrixView y_all) {
  CheckMoeExpertsShapes(x_all, expert_ids, weights, top_k, experts, y_all);
  const auto local = static_cast<int64_t>(experts.size());
  const ExpertGroups groups =
      GroupByExpert(expert_ids, weights, top_k, first_expert, local);
  for (int64_t e = 0; e < local; ++e) {
    const int64_t n = groups.count(e);
    if (n == 0) continue;
    const int64_t begin = groups.offsets[e];
    ExpertForward(x_all, absl::MakeConstSpan(groups.rows).subspan(begin, n),
                  absl::MakeConstSpan(groups.weights).subspan(begin, n),
                  *experts[e].w1, *experts[e].w2, *experts[e].w3, limit, y_all);
  }
}

void CpuBackend::MoeLayer(ConstMatrixView x_all, ConstMatrixView logits,
                          const MoeRouting& routing, int64_t first_expert,
                          absl::Span<const ExpertRef> experts, float limit,
                          MatrixView y_all) {
  CheckMoeLayerShapes(x_all, logits, routing, experts, y_all);
  MoeLayerByParts(*this, x_all, logits, routing, first_expert, experts, limit,
                  y_all);
}

}  // namespace mneme::gpu
