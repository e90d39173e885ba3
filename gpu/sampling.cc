#include "gpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/types/span.h"
#include "gpu/backend.h"

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
    const double w = std::exp((double{row[i]} - max_logit) * inv_temperature);
    weight[i] = std::isnan(w) ? 0.0 : w;
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

namespace {

// log(sum_i exp(row[i])) in double.
double LogSumExp(const float* row, int64_t n) {
  const float max = *std::max_element(row, row + n);
  if (std::isinf(max)) return max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double{row[i]} - max);
  return max + std::log(sum);
}

float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

double SamplingUniform(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

int32_t SampleToken(const float* row, int64_t vocab, const SamplingParams& p) {
  const auto argmax = [&] {
    return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  };
  SamplingCandidates c;
  if (!FindSamplingCandidates(row, vocab, p, c)) return argmax();
  // The draw walks the kept tokens in id order.
  std::sort(c.kept.begin(), c.kept.end());
  double mass = 0.0;
  for (int32_t id : c.kept) mass += c.weight[id];
  if (!(mass > 0.0)) return argmax();
  const double u = SamplingUniform(p.seed) * mass;
  double cumulative = 0.0;
  int32_t last = -1;
  for (int32_t id : c.kept) {
    if (c.weight[id] > 0.0) last = id;
    cumulative += c.weight[id];
    if (cumulative > u) return id;
  }
  return last;
}

float LogProbOf(const float* row, int64_t vocab, int32_t id) {
  return static_cast<float>(row[id] - LogSumExp(row, vocab));
}

void MoeRouter::Route(const float* logits, int64_t experts, const float* bias,
                      int top_k, float routed_scaling, int32_t* expert_ids,
                      float* weights) {
  score_.resize(static_cast<size_t>(experts));
  biased_.resize(static_cast<size_t>(experts));
  order_.resize(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    score_[e] = std::sqrt(Softplus(logits[e]));
    biased_[e] = score_[e] + (bias != nullptr ? bias[e] : 0.0f);
  }
  std::iota(order_.begin(), order_.end(), 0);
  std::partial_sort(order_.begin(), order_.begin() + top_k, order_.end(),
                    [this](int32_t a, int32_t b) {
                      // NaN after every number: a strict order always.
                      const bool na = std::isnan(biased_[a]);
                      const bool nb = std::isnan(biased_[b]);
                      if (na != nb) return nb;
                      if (!na && biased_[a] != biased_[b]) {
                        return biased_[a] > biased_[b];
                      }
                      return a < b;
                    });
  float sum = 0.0f;
  for (int i = 0; i < top_k; ++i) sum += score_[order_[i]];
  for (int i = 0; i < top_k; ++i) {
    expert_ids[i] = order_[i];
    weights[i] = sum > 0.0f ? score_[order_[i]] / sum * routed_scaling
                            : routed_scaling / static_cast<float>(top_k);
  }
}

void HashRoute(const float* logits, absl::Span<const int32_t> listed,
               float routed_scaling, int32_t* expert_ids, float* weights) {
  const auto top_k = static_cast<int64_t>(listed.size());
  double sum = 0.0;
  for (int64_t i = 0; i < top_k; ++i) {
    const int32_t e = listed[i];
    const double x = logits[e];
    const double s = std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x)));
    bool repeated = false;
    for (int64_t j = 0; j < i; ++j) repeated = repeated || listed[j] == e;
    expert_ids[i] = repeated ? -1 : e;
    weights[i] = static_cast<float>(s);
    sum += s;
  }
  for (int64_t i = 0; i < top_k; ++i) {
    weights[i] = static_cast<float>(weights[i] / sum * routed_scaling);
  }
}

void MoeLayerByParts(Backend& backend, ConstMatrixView x_all,
                     ConstMatrixView logits, const MoeRouting& routing,
                     int64_t first_expert, absl::Span<const ExpertRef> experts,
                     float limit, MatrixView y_all) {
  const int64_t tokens = logits.rows;
  const int64_t count = tokens * routing.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(count));
  std::vector<float> weights(static_cast<size_t>(count));
  if (routing.hash_experts.empty()) {
    backend.MoeRoute(logits, routing.bias, routing.top_k,
                     routing.routed_scaling, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  } else {
    std::vector<float> host(static_cast<size_t>(tokens * logits.cols));
    backend.CopyToHost(logits.data, absl::MakeSpan(host));
    for (int64_t t = 0; t < tokens; ++t) {
      HashRoute(host.data() + t * logits.cols,
                routing.hash_experts.subspan(t * routing.top_k, routing.top_k),
                routing.routed_scaling, ids.data() + t * routing.top_k,
                weights.data() + t * routing.top_k);
    }
  }
  backend.MoeExperts(x_all, ids, weights, routing.top_k, first_expert, experts,
                     limit, y_all);
}

void SelectTopEntries(const float* row, int64_t cols, float scale,
                      int64_t visible, int k, const int32_t* blocks,
                      int64_t num_blocks, int block_size,
                      std::vector<int32_t>& scratch,
                      std::vector<int32_t>& out) {
  visible = std::clamp<int64_t>(visible, 0, cols);
  std::vector<int32_t>& eligible = scratch;
  eligible.clear();
  if (num_blocks == 0) {
    eligible.resize(static_cast<size_t>(visible));
    std::iota(eligible.begin(), eligible.end(), 0);
  } else {
    for (int64_t j = 0; j < num_blocks && blocks[j] >= 0; ++j) {
      const int64_t first = int64_t{blocks[j]} * block_size;
      const int64_t end = std::min<int64_t>(visible, first + block_size);
      for (int64_t e = first; e < end; ++e) {
        eligible.push_back(static_cast<int32_t>(e));
      }
    }
  }
  if (static_cast<int64_t>(eligible.size()) > k) {
    // NaN after every number: a strict order always.
    const auto better = [row, scale](int32_t a, int32_t b) {
      const float va = row[a] * scale;
      const float vb = row[b] * scale;
      const bool na = std::isnan(va);
      const bool nb = std::isnan(vb);
      if (na != nb) return nb;
      if (!na && va != vb) return va > vb;
      return a < b;
    };
    std::nth_element(eligible.begin(), eligible.begin() + k, eligible.end(),
                     better);
    eligible.resize(static_cast<size_t>(k));
    std::sort(eligible.begin(), eligible.end());
  }
  out.assign(eligible.begin(), eligible.end());
}

void SelectTopBlocks(const float* row, int64_t cols, float scale,
                     int64_t visible, int topk_blocks, int block_size,
                     std::vector<float>& scratch, std::vector<int32_t>& out) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  visible = std::clamp<int64_t>(visible, 0, cols);
  const int64_t blocks = (visible + block_size - 1) / block_size;
  std::vector<float>& block_score = scratch;
  block_score.assign(static_cast<size_t>(blocks), -kInf);
  for (int64_t e = 0; e < visible; ++e) {
    float& s = block_score[e / block_size];
    s = std::max(s, row[e] * scale);  // keeps s for a NaN
  }
  if (visible > 0) block_score[(visible - 1) / block_size] = kInf;
  out.resize(static_cast<size_t>(blocks));
  std::iota(out.begin(), out.end(), 0);
  const int64_t k = std::min<int64_t>(topk_blocks, blocks);
  std::partial_sort(out.begin(), out.begin() + k, out.end(),
                    [&](int32_t a, int32_t b) {
                      return block_score[a] > block_score[b] ||
                             (block_score[a] == block_score[b] && a < b);
                    });
  out.resize(static_cast<size_t>(k));
  out.erase(std::remove_if(out.begin(), out.end(),
                           [&](int32_t b) { return block_score[b] == -kInf; }),
            out.end());
  std::sort(out.begin(), out.end());
}

ExpertGroups GroupByExpert(absl::Span<const int32_t> expert_ids,
                           absl::Span<const float> weights, int top_k,
                           int64_t first_expert, int64_t experts) {
  ExpertGroups g;
  g.offsets.assign(static_cast<size_t>(experts) + 1, 0);
  const auto n = static_cast<int64_t>(expert_ids.size());
  // Counting sort: counts, their prefix sums, then the assignments in order.
  for (int64_t a = 0; a < n; ++a) {
    const int64_t e = int64_t{expert_ids[a]} - first_expert;
    if (e >= 0 && e < experts) ++g.offsets[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) g.offsets[e + 1] += g.offsets[e];
  g.rows.resize(static_cast<size_t>(g.offsets[experts]));
  g.weights.resize(g.rows.size());
  std::vector<int64_t> next(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t a = 0; a < n; ++a) {
    const int64_t e = int64_t{expert_ids[a]} - first_expert;
    if (e < 0 || e >= experts) continue;
    const int64_t i = next[e]++;
    g.rows[i] = static_cast<int32_t>(a / top_k);
    g.weights[i] = weights[a];
  }
  return g;
}

}  // namespace mneme::gpu
