#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/types/span.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cpu/cpu_backend_internal.h"
#include "gpu/cpu/cpu_kernels.h"

namespace mneme::gpu {
namespace {

using cpu_backend_internal::Grain;

// log(sum_i exp(row[i])) in double.
double LogSumExp(const float* row, int64_t n) {
  const float max = *std::max_element(row, row + n);
  if (std::isinf(max)) return max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double{row[i]} - max);
  return max + std::log(sum);
}

// The lowest id of the largest logit.
int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// SplitMix64's first output for `seed`, as a double in [0, 1).
double UniformFromSeed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

// One sampled token of a row of logits (see the class comment).
int32_t SampleRow(const float* row, int64_t vocab, const SamplingParams& p) {
  if (!(p.temperature > 0.0f)) return Argmax(row, vocab);
  const float max_logit = *std::max_element(row, row + vocab);
  if (!std::isfinite(max_logit)) return Argmax(row, vocab);
  // Unnormalised probabilities after temperature; the largest is 1.
  std::vector<double> weight(static_cast<size_t>(vocab));
  const double inv_temperature = 1.0 / double{p.temperature};
  for (int64_t i = 0; i < vocab; ++i) {
    weight[i] = std::exp((double{row[i]} - max_logit) * inv_temperature);
  }
  std::vector<int32_t> kept(static_cast<size_t>(vocab));
  std::iota(kept.begin(), kept.end(), 0);
  const auto more_likely = [&weight](int32_t a, int32_t b) {
    return weight[a] > weight[b] || (weight[a] == weight[b] && a < b);
  };
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0f;
  if (top_k || top_p) {
    const size_t n = top_k ? static_cast<size_t>(p.top_k) : kept.size();
    std::partial_sort(kept.begin(), kept.begin() + n, kept.end(), more_likely);
    kept.resize(n);
  }
  if (top_p) {
    double mass = 0.0;
    for (int32_t id : kept) mass += weight[id];
    const double target = double{p.top_p} * mass;
    double cumulative = 0.0;
    size_t n = 0;
    while (n < kept.size()) {
      cumulative += weight[kept[n++]];
      if (cumulative >= target) break;
    }
    kept.resize(std::max<size_t>(n, 1));
  }
  if (p.min_p > 0.0f) {
    // The most likely token is always kept (its weight is 1).
    const double floor = double{p.min_p};
    kept.erase(std::remove_if(kept.begin(), kept.end(),
                              [&](int32_t id) { return weight[id] < floor; }),
               kept.end());
  }
  double mass = 0.0;
  for (int32_t id : kept) mass += weight[id];
  const double u = UniformFromSeed(p.seed) * mass;
  double cumulative = 0.0;
  for (int32_t id : kept) {
    cumulative += weight[id];
    if (cumulative > u) return id;
  }
  return kept.back();
}

}  // namespace

void CpuBackend::Sample(ConstMatrixView logits,
                        absl::Span<const SamplingParams> params,
                        absl::Span<int32_t> ids, absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_GT(vocab, 0);
  CHECK_EQ(static_cast<int64_t>(params.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  pool_.ParallelFor(tokens, Grain(vocab * 20), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = logits.data + t * vocab;
      const int32_t id = SampleRow(row, vocab, params[t]);
      ids[t] = id;
      logprobs[t] = static_cast<float>(row[id] - LogSumExp(row, vocab));
    }
  });
}

void CpuBackend::LogProbs(ConstMatrixView logits, absl::Span<const int32_t> ids,
                          absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  pool_.ParallelFor(tokens, Grain(vocab * 10), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      CHECK(ids[t] >= 0 && ids[t] < vocab) << "id " << ids[t];
      const float* row = logits.data + t * vocab;
      logprobs[t] = static_cast<float>(row[ids[t]] - LogSumExp(row, vocab));
    }
  });
}

}  // namespace mneme::gpu
