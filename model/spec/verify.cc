#include "model/spec/verify.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "gpu/sampling.h"

namespace mneme::model {
namespace {

// Residual mass below which a residual distribution is treated as empty
// (the target's own distribution is drawn from instead).
constexpr double kEmptyResidual = 1e-12;

// The i-th uniform in [0, 1) of `seed` (SplitMix64 of seed + i).
double Uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

// A draw from the (unnormalised, non-negative) weights with uniform u.
int64_t Draw(const std::vector<double>& weight, double u) {
  const double mass = std::accumulate(weight.begin(), weight.end(), 0.0);
  const double target = u * mass;
  double cumulative = 0.0;
  int64_t last = 0;
  for (size_t i = 0; i < weight.size(); ++i) {
    if (weight[i] <= 0.0) continue;
    last = static_cast<int64_t>(i);
    cumulative += weight[i];
    if (cumulative > target) return last;
  }
  return last;
}

// max(scale * p - q, 0) per token and its sum.
double Residual(const std::vector<double>& p, double scale,
                const std::vector<double>& q, std::vector<double>& out) {
  out.resize(p.size());
  double sum = 0.0;
  for (size_t x = 0; x < p.size(); ++x) {
    out[x] = std::max(scale * p[x] - q[x], 0.0);
    sum += out[x];
  }
  return sum;
}

// A draw from the residual, or from the target when the residual is empty.
int64_t DrawResidual(const std::vector<double>& residual, double mass,
                     const std::vector<double>& target, double u) {
  return mass > kEmptyResidual ? Draw(residual, u) : Draw(target, u);
}

}  // namespace

absl::StatusOr<VerifyRule> ParseVerifyRule(absl::string_view name) {
  if (name == "block") return VerifyRule::kBlock;
  if (name == "standard") return VerifyRule::kStandard;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown verification rule '", name, "' (block or standard)"));
}

std::vector<double> SamplingDistribution(absl::Span<const float> logits,
                                         const gpu::SamplingParams& p) {
  std::vector<double> prob(logits.size(), 0.0);
  if (logits.empty()) return prob;
  gpu::SamplingCandidates c;
  if (!gpu::FindSamplingCandidates(logits.data(),
                                   static_cast<int64_t>(logits.size()), p, c)) {
    prob[std::max_element(logits.begin(), logits.end()) - logits.begin()] = 1.0;
    return prob;
  }
  double mass = 0.0;
  for (int32_t id : c.kept) mass += c.weight[id];
  for (int32_t id : c.kept) prob[id] = c.weight[id] / mass;
  return prob;
}

Verdict VerifyGreedy(absl::Span<const float> target_logits, int64_t vocab,
                     absl::Span<const int64_t> drafts) {
  const int k = static_cast<int>(drafts.size());
  Verdict v;
  for (int j = 0; j <= k; ++j) {
    const float* row = target_logits.data() + j * vocab;
    const int64_t best = std::max_element(row, row + vocab) - row;
    if (j == k || drafts[j] != best) {
      v.accepted = j;
      v.next = best;
      return v;
    }
  }
  return v;
}

Verdict VerifySampled(const std::vector<std::vector<double>>& target,
                      const std::vector<std::vector<double>>& draft,
                      absl::Span<const int64_t> drafts, VerifyRule rule,
                      uint64_t seed) {
  const int k = static_cast<int>(drafts.size());
  // Uniforms 0..k-1 decide acceptance, k draws the next token.
  const double u_next = Uniform(seed, static_cast<uint64_t>(k));
  std::vector<double> residual;
  Verdict v;
  if (rule == VerifyRule::kStandard) {
    for (int i = 0; i < k; ++i) {
      const double pt = target[i][drafts[i]], pd = draft[i][drafts[i]];
      const bool accept = pd > 0.0 && Uniform(seed, i) * pd < pt;
      if (!accept) {
        const double mass = Residual(target[i], 1.0, draft[i], residual);
        v.accepted = i;
        v.next = DrawResidual(residual, mass, target[i], u_next);
        return v;
      }
    }
    v.accepted = k;
    v.next = Draw(target[k], u_next);
    return v;
  }
  // Block verification (Sun et al., "Block Verification Accelerates
  // Speculative Decoding", Algorithm 2): p_0 = 1, p_i = min(p_{i-1} *
  // p_t(x_i) / p_d(x_i), 1); h_i = Z / (Z + 1 - p_i) with Z the residual
  // mass sum_x max(p_i p_t(x | x_<=i) - p_d(x | x_<=i), 0), h_k = p_k; the
  // largest i with u_i < h_i is accepted, and the next token comes from
  // the residual after it (the target itself after all k).
  std::vector<double> p(k + 1, 1.0);
  int tau = 0;
  for (int i = 1; i <= k; ++i) {
    const double pt = target[i - 1][drafts[i - 1]];
    const double pd = draft[i - 1][drafts[i - 1]];
    p[i] = pd > 0.0 ? std::min(p[i - 1] * pt / pd, 1.0) : 0.0;
    double h;
    if (i == k) {
      h = p[k];
    } else {
      const double z = Residual(target[i], p[i], draft[i], residual);
      h = z > kEmptyResidual ? z / (z + 1.0 - p[i]) : 0.0;
    }
    if (Uniform(seed, i - 1) < h) tau = i;
  }
  v.accepted = tau;
  if (tau == k) {
    v.next = Draw(target[k], u_next);
  } else {
    const double mass = Residual(target[tau], p[tau], draft[tau], residual);
    v.next = DrawResidual(residual, mass, target[tau], u_next);
  }
  return v;
}

}  // namespace mneme::model
