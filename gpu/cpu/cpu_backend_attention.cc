#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/types/span.h"
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
using cpu_backend_internal::Grain;
using cpu_backend_internal::kInf;
using cpu_backend_internal::Sigmoid;

// Keys scored per step of the online softmax.
constexpr int kKeyChunk = 128;

// One (query, head): out[hd] and its lse over the `keys` rows of kv.
void AttendOne(const float* q, const float* kv, int64_t hd, int64_t keys,
               float scale, float* out, float* lse) {
  float scores[kKeyChunk];
  float max = -kInf;
  float denominator = 0.0f;
  bool any = false;
  std::fill(out, out + hd, 0.0f);
  {
    for (int64_t j = 0; j < keys; j += kKeyChunk) {
      const int64_t n = std::min<int64_t>(kKeyChunk, keys - j);
      const float* rows = kv + j * hd;
      k::DotRows(q, rows, n, hd, scale, scores);
      const float chunk_max = *std::max_element(scores, scores + n);
      if (!any || chunk_max > max) {
        // Rescale what was accumulated under the old maximum.
        if (any) {
          const float correction = std::exp(max - chunk_max);
          denominator *= correction;
          k::Scale(correction, out, hd);
        }
        max = chunk_max;
      }
      any = true;
      for (int64_t i = 0; i < n; ++i) {
        scores[i] = std::exp(scores[i] - max);
        denominator += scores[i];
      }
      k::WeightedRowSum(scores, rows, n, hd, out);
    }
  }
  if (!any) {
    *lse = -kInf;
    return;
  }
  k::Scale(1.0f / denominator, out, hd);
  *lse = max + std::log(denominator);
}

// One row of a top-k's host outputs: `chosen` then -1 up to `width`, and
// the count.
void PutChoice(const std::vector<int32_t>& chosen, int width, int32_t* row,
               int32_t* count) {
  std::copy(chosen.begin(), chosen.end(), row);
  std::fill(row + chosen.size(), row + width, -1);
  *count = static_cast<int32_t>(chosen.size());
}

}  // namespace

void CpuBackend::SparseAttention(ConstMatrixView q, ConstMatrixView kv,
                                 int heads, absl::Span<const int32_t> idx,
                                 int width, float scale, const float* sink,
                                 MatrixView out, MatrixView lse) {
  CheckSparseAttentionShapes(q, kv, heads, idx, width, out, lse);
  const int64_t hd = kv.cols;
  const int64_t tokens = q.rows;
  if (tokens == 0) return;
  // Each query's keys are gathered once into a contiguous block, then every
  // head attends over it.
  pool_.ParallelFor(tokens, Grain(2 * hd * (width + 1) * heads),
                    [&](int64_t begin, int64_t end) {
                      std::vector<float> keys(static_cast<size_t>(width) * hd);
                      for (int64_t t = begin; t < end; ++t) {
                        int32_t n = 0;
                        for (int j = 0; j < width; ++j) {
                          const int32_t row = idx[t * width + j];
                          if (row < 0) continue;
                          std::memcpy(
                              keys.data() + static_cast<int64_t>(n) * hd,
                              kv.data + static_cast<int64_t>(row) * hd,
                              hd * sizeof(float));
                          ++n;
                        }
                        for (int h = 0; h < heads; ++h) {
                          float* o = out.data + t * out.cols + h * hd;
                          float* l = lse.data + t * lse.cols + h;
                          AttendOne(q.data + t * q.cols + h * hd, keys.data(),
                                    hd, n, scale, o, l);
                          if (sink != nullptr)
                            k::Scale(Sigmoid(*l - sink[h]), o, hd);
                        }
                      }
                    });
}

void CpuBackend::IndexScores(ConstMatrixView q, ConstMatrixView w,
                             ConstMatrixView keys,
                             absl::Span<const int32_t> rows, MatrixView out) {
  CheckIndexScoresShapes(q, w, keys, rows, out);
  const int64_t tokens = q.rows;
  const int64_t heads = w.cols;
  const int64_t d = q.cols / heads;
  const int64_t n = out.cols;
  if (tokens == 0 || n == 0) return;
  // Each query its own rows, or all the same.
  const int64_t stride = static_cast<int64_t>(rows.size()) == n ? 0 : n;
  // Over the keys (each shared one read once per token block), then the
  // tokens and heads.
  pool_.ParallelFor(
      n, Grain(2 * heads * d * tokens), [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          for (int64_t t = 0; t < tokens; ++t) {
            const int32_t row = rows[t * stride + j];
            float score = 0.0f;
            if (row >= 0) {
              const float* key = keys.data + int64_t{row} * keys.cols;
              for (int64_t h = 0; h < heads; ++h) {
                const float dot = k::Dot(q.data + t * q.cols + h * d, key, d);
                score += w.data[t * heads + h] * std::max(dot, 0.0f);
              }
            }
            out.data[t * n + j] = score;
          }
        }
      });
}

void CpuBackend::SelectTopK(ConstMatrixView scores, float scale,
                            absl::Span<const int64_t> visible, int k,
                            absl::Span<const int32_t> candidate_blocks,
                            int blocks_per_row, int block_size,
                            absl::Span<int32_t> ids,
                            absl::Span<int32_t> counts) {
  CheckSelectTopKShapes(scores, visible, k, candidate_blocks, blocks_per_row,
                        block_size, ids, counts);
  const int64_t n = scores.cols;
  pool_.ParallelFor(scores.rows, Grain(4 * n), [&](int64_t begin, int64_t end) {
    std::vector<int32_t> scratch;
    std::vector<int32_t> chosen;
    for (int64_t t = begin; t < end; ++t) {
      SelectTopEntries(scores.data + t * n, n, scale, visible[t], k,
                       candidate_blocks.data() + t * int64_t{blocks_per_row},
                       blocks_per_row, block_size, scratch, chosen);
      PutChoice(chosen, k, ids.data() + t * k, &counts[t]);
    }
  });
}

void CpuBackend::ChooseAndAttend(ConstMatrixView scores, float index_scale,
                                 absl::Span<const int64_t> visible, int k,
                                 absl::Span<const int32_t> entry_rows,
                                 ConstMatrixView q, ConstMatrixView kv,
                                 int heads, absl::Span<const int32_t> fixed,
                                 int fixed_width, float scale,
                                 const float* sink, MatrixView out,
                                 MatrixView lse) {
  CheckChooseAndAttendShapes(scores, visible, k, entry_rows, q, kv, heads,
                             fixed, fixed_width, out, lse);
  const int64_t tokens = q.rows, n = scores.cols;
  std::vector<int32_t> ids(tokens * k);
  std::vector<int32_t> counts(tokens);
  SelectTopK(scores, index_scale, visible, k, {}, 0, 1, absl::MakeSpan(ids),
             absl::MakeSpan(counts));
  const int width = fixed_width + k;
  std::vector<int32_t> idx(tokens * width, -1);
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* row = idx.data() + t * width;
    std::copy_n(fixed.data() + t * fixed_width, fixed_width, row);
    for (int32_t c = 0; c < counts[t]; ++c) {
      row[fixed_width + c] = entry_rows[t * n + ids[t * k + c]];
    }
  }
  SparseAttention(q, kv, heads, idx, width, scale, sink, out, lse);
}

void CpuBackend::SelectCandidateBlocks(ConstMatrixView scores, float scale,
                                       absl::Span<const int64_t> visible,
                                       int topk_blocks, int block_size,
                                       absl::Span<int32_t> blocks,
                                       absl::Span<int32_t> counts) {
  CheckSelectCandidateBlocksShapes(scores, visible, topk_blocks, block_size,
                                   blocks, counts);
  const int64_t n = scores.cols;
  pool_.ParallelFor(scores.rows, Grain(4 * n), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    std::vector<int32_t> chosen;
    for (int64_t t = begin; t < end; ++t) {
      SelectTopBlocks(scores.data + t * n, n, scale, visible[t], topk_blocks,
                      block_size, scratch, chosen);
      PutChoice(chosen, topk_blocks, blocks.data() + t * topk_blocks,
                &counts[t]);
    }
  });
}

void CpuBackend::ApplySink(ConstMatrixView lse, const float* sink,
                           MatrixView out) {
  CHECK_EQ(lse.rows, out.rows);
  CHECK_GT(lse.cols, 0);
  CHECK_EQ(out.cols % lse.cols, 0);
  const int64_t heads = lse.cols;
  const int64_t hd = out.cols / heads;
  for (int64_t t = 0; t < out.rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      k::Scale(Sigmoid(lse.data[t * heads + h] - sink[h]),
               out.data + t * out.cols + h * hd, hd);
    }
  }
}

void CpuBackend::WeighDcpParts(ConstMatrixView lses, ConstMatrixView part,
                               int rank, int64_t heads, MatrixView send,
                               MatrixView global_own) {
  CheckWeighDcpPartsShapes(lses, part, rank, heads, send, global_own);
  const int64_t ranks = lses.rows;
  const int64_t tokens = part.rows;
  const int64_t th = tokens * heads;
  const int64_t hl = heads / ranks;
  const int64_t hd = part.cols / heads;
  for (int64_t i = 0; i < th; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t q = 0; q < ranks; ++q) m = std::max(m, lses.data[q * th + i]);
    double sum = 0;
    if (std::isfinite(m)) {
      for (int64_t q = 0; q < ranks; ++q) {
        sum += std::exp(lses.data[q * th + i] - m);
      }
    }
    const float g =
        std::isfinite(m) ? m + static_cast<float>(std::log(sum)) : m;
    const int64_t t = i / heads;
    const int64_t h = i % heads;
    const int64_t owner = h / hl;
    if (owner == rank) global_own.data[t * hl + h % hl] = g;
    const float l = lses.data[rank * th + i];
    const float w = std::isfinite(l) ? std::exp(l - g) : 0.0f;
    const float* src = part.data + t * part.cols + h * hd;
    float* dst = send.data + (owner * tokens + t) * send.cols + (h % hl) * hd;
    for (int64_t c = 0; c < hd; ++c) dst[c] = w * src[c];
  }
}

void CpuBackend::SoftmaxPool(ConstMatrixView kv, ConstMatrixView score,
                             ConstMatrixView ape, MatrixView out) {
  const int64_t entries = out.rows;
  const int64_t d = kv.cols;
  CHECK_GT(entries, 0);
  CHECK_EQ(kv.rows % entries, 0);
  const int64_t r = kv.rows / entries;
  CHECK_GT(r, 0);
  CHECK_EQ(score.rows, kv.rows);
  CHECK_EQ(score.cols, d);
  CHECK_EQ(ape.rows, r);
  CHECK_EQ(ape.cols, d);
  CHECK_EQ(out.cols, d);
  std::vector<float> max(d), denominator(d), numerator(d);
  for (int64_t e = 0; e < entries; ++e) {
    const float* s = score.data + e * r * d;
    const float* v = kv.data + e * r * d;
    std::fill(max.begin(), max.end(), -kInf);
    std::fill(denominator.begin(), denominator.end(), 0.0f);
    std::fill(numerator.begin(), numerator.end(), 0.0f);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t c = 0; c < d; ++c) {
        max[c] = std::max(max[c], s[i * d + c] + ape.data[i * d + c]);
      }
    }
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t c = 0; c < d; ++c) {
        const float x = std::exp(s[i * d + c] + ape.data[i * d + c] - max[c]);
        denominator[c] += x;
        numerator[c] += x * v[i * d + c];
      }
    }
    for (int64_t c = 0; c < d; ++c) {
      out.data[e * d + c] = numerator[c] / denominator[c];
    }
  }
}

}  // namespace mneme::gpu
