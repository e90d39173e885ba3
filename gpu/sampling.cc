#include "gpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mneme::gpu {

bool FindSamplingCandidates(const float* row, int64_t vocab,
                            const SamplingParams& p, SamplingCandidates& out) {
  if (!(p.temperature > 0.0f)) return false;
  const float max_logit = *std::max_element(row, row + vocab);
  if (!std::isfinite(max_logit)) return false;
  std::vector<double>& weight = out.weight;
  weight.resize(static_cast<size_t>(vocab));
  const double inv_temperature = 1.0 / double{p.temperature};
  for (int64_t i = 0; i < vocab; ++i) {
    weight[i] = std::exp((double{row[i]} - max_logit) * inv_temperature);
  }
  std::vector<int32_t>& kept = out.kept;
  kept.resize(static_cast<size_t>(vocab));
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
  return true;
}

}  // namespace mneme::gpu
