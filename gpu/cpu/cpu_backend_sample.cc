#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cpu/cpu_backend_internal.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/sampling.h"

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
  SamplingCandidates c;
  if (!FindSamplingCandidates(row, vocab, p, c)) return Argmax(row, vocab);
  double mass = 0.0;
  for (int32_t id : c.kept) mass += c.weight[id];
  const double u = UniformFromSeed(p.seed) * mass;
  double cumulative = 0.0;
  for (int32_t id : c.kept) {
    cumulative += c.weight[id];
    if (cumulative > u) return id;
  }
  return c.kept.back();
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
