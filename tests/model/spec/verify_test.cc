#include "model/spec/verify.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gtest/gtest.h"

namespace mneme::model {
namespace {

// Chi-squared statistic of observed counts against expected probabilities
// (cells with expected count < 1e-9 must be empty); `dof` receives the
// degrees of freedom.
double ChiSquared(const std::vector<int64_t>& observed,
                  const std::vector<double>& expected, int64_t n, int& dof) {
  double chi = 0;
  dof = -1;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = expected[i] * static_cast<double>(n);
    if (e < 1e-9) {
      EXPECT_EQ(observed[i], 0) << "cell " << i << " has probability 0";
      continue;
    }
    ++dof;
    const double d = static_cast<double>(observed[i]) - e;
    chi += d * d / e;
  }
  return chi;
}

// The 99.99th percentile of chi-squared with `dof` degrees of freedom
// (Wilson-Hilferty), so a correct sampler fails one run in 10^4.
double ChiSquaredCritical(int dof) {
  const double z = 3.719;  // Standard normal 99.99th percentile.
  const double k = dof;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

TEST(VerifyGreedyTest, AcceptsTheMatchingPrefixThenTheTargetsToken) {
  const int64_t V = 4;
  // Target argmax per row: 2, 1, 3, 0.
  const std::vector<float> logits = {0, 0, 5, 0, 0, 5, 0, 0,
                                     0, 0, 0, 5, 5, 0, 0, 0};
  Verdict v = VerifyGreedy(logits, V, std::vector<int64_t>{2, 1, 3});
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 0);  // The bonus token.
  v = VerifyGreedy(logits, V, std::vector<int64_t>{2, 0, 3});
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.next, 1);  // The target's token at the first mismatch.
  v = VerifyGreedy(logits, V, std::vector<int64_t>{1, 1, 3});
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 2);
}

TEST(VerifyRuleTest, ParsesTheRuleNames) {
  EXPECT_EQ(*ParseVerifyRule("block"), VerifyRule::kBlock);
  EXPECT_EQ(*ParseVerifyRule("standard"), VerifyRule::kStandard);
  EXPECT_FALSE(ParseVerifyRule("typical").ok());
}

TEST(SamplingDistributionTest, GreedyIsOneHotOfTheLowestArgmax) {
  const std::vector<float> logits = {1, 3, 3, 0};
  const std::vector<double> p = SamplingDistribution(logits, {});
  EXPECT_EQ(p, (std::vector<double>{0, 1, 0, 0}));
}

// The distribution is the one the backend's sampler draws from.
TEST(SamplingDistributionTest, MatchesTheCpuSamplersDraws) {
  std::unique_ptr<gpu::Backend> backend = *gpu::CpuBackend::Create({});
  const std::vector<float> logits = {0.3f, 1.2f, -0.5f, 2.0f, 0.9f, 1.9f};
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<gpu::SamplingParams> cases(4);
  cases[0].temperature = 1.0f;
  cases[1].temperature = 0.7f, cases[1].top_k = 3;
  cases[2].temperature = 1.3f, cases[2].top_p = 0.8f;
  cases[3].temperature = 1.0f, cases[3].min_p = 0.3f;
  auto buffer = *backend->Allocate(V);
  backend->CopyFromHost(logits, buffer->data());
  for (const gpu::SamplingParams& base : cases) {
    const std::vector<double> p = SamplingDistribution(logits, base);
    const int64_t n = 20000;
    std::vector<int64_t> counts(V, 0);
    for (int64_t i = 0; i < n; ++i) {
      gpu::SamplingParams params = base;
      params.seed = 1000 + static_cast<uint64_t>(i);
      int32_t id = 0;
      float lp = 0;
      backend->Sample(buffer->view(1, V), {params}, absl::MakeSpan(&id, 1),
                      absl::MakeSpan(&lp, 1));
      ++counts[id];
    }
    int dof = 0;
    const double chi = ChiSquared(counts, p, n, dof);
    EXPECT_LT(chi, ChiSquaredCritical(std::max(dof, 1)))
        << "temperature " << base.temperature << " top_k " << base.top_k;
  }
}

// A toy autoregressive "model" over a small vocabulary: the logits of the
// next token depend on the whole prefix (a hash of it), with a `bias` that
// makes two such models agree more or less.
std::vector<float> ToyLogits(const std::vector<int64_t>& prefix, int64_t V,
                             uint64_t salt, float spread) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (int64_t t : prefix)
    h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
  std::vector<float> out(V);
  for (int64_t x = 0; x < V; ++x) {
    uint64_t z = h + static_cast<uint64_t>(x) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 32;
    out[x] = spread * static_cast<float>(
                          static_cast<double>(z % 10000) / 10000.0 - 0.5) +
             (x == 0 ? 0.5f : 0.0f);
  }
  return out;
}

struct SpecRunStats {
  std::vector<int64_t> counts;  // Of the first three tokens, V^3 cells.
  double mean_accepted = 0;
};

// Speculative generation of >= 3 tokens, `runs` times: the drafter draws k
// tokens from its own distribution, the target's k + 1 rows are computed
// for the drafted prefixes, the verifier commits accepted + 1 tokens.
SpecRunStats RunSpeculative(int64_t V, int k, VerifyRule rule,
                            const gpu::SamplingParams& sampling, int64_t runs) {
  std::unique_ptr<gpu::Backend> backend = *gpu::CpuBackend::Create({});
  SpecRunStats stats;
  stats.counts.assign(V * V * V, 0);
  int64_t steps = 0, accepted = 0;
  auto draw = [&](const std::vector<double>& p, uint64_t seed) {
    // Inverse CDF with an independent uniform.
    uint64_t z = seed * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull;
    z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
    z ^= z >> 29;
    const double u = static_cast<double>(z >> 11) * 0x1p-53;
    double c = 0;
    for (int64_t x = 0; x < V; ++x) {
      c += p[x];
      if (u < c) return x;
    }
    return V - 1;
  };
  for (int64_t r = 0; r < runs; ++r) {
    std::vector<int64_t> seq;
    uint64_t step_seed = static_cast<uint64_t>(r) * 7919 + 17;
    while (seq.size() < 3) {
      std::vector<std::vector<double>> draft, target;
      std::vector<int64_t> drafts;
      std::vector<int64_t> ctx = seq;
      for (int i = 0; i < k; ++i) {
        draft.push_back(
            SamplingDistribution(ToyLogits(ctx, V, 2, 2.0f), sampling));
        drafts.push_back(draw(draft.back(), step_seed * 31 + i));
        ctx.push_back(drafts.back());
      }
      ctx = seq;
      for (int i = 0; i <= k; ++i) {
        target.push_back(
            SamplingDistribution(ToyLogits(ctx, V, 1, 2.5f), sampling));
        if (i < k) ctx.push_back(drafts[i]);
      }
      const Verdict v = VerifySampled(target, draft, drafts, rule, step_seed);
      EXPECT_GE(v.accepted, 0);
      EXPECT_LE(v.accepted, k);
      for (int i = 0; i < v.accepted; ++i) seq.push_back(drafts[i]);
      seq.push_back(v.next);
      ++steps;
      accepted += v.accepted;
      step_seed = step_seed * 6364136223846793005ull + 1442695040888963407ull;
    }
    ++stats.counts[(seq[0] * V + seq[1]) * V + seq[2]];
  }
  stats.mean_accepted = static_cast<double>(accepted) / steps;
  return stats;
}

// The exact distribution of the first three tokens under the target.
std::vector<double> TargetJoint(int64_t V,
                                const gpu::SamplingParams& sampling) {
  std::vector<double> joint(V * V * V, 0.0);
  const std::vector<double> p0 =
      SamplingDistribution(ToyLogits({}, V, 1, 2.5f), sampling);
  for (int64_t a = 0; a < V; ++a) {
    const std::vector<double> p1 =
        SamplingDistribution(ToyLogits({a}, V, 1, 2.5f), sampling);
    for (int64_t b = 0; b < V; ++b) {
      const std::vector<double> p2 =
          SamplingDistribution(ToyLogits({a, b}, V, 1, 2.5f), sampling);
      for (int64_t c = 0; c < V; ++c) {
        joint[(a * V + b) * V + c] = p0[a] * p1[b] * p2[c];
      }
    }
  }
  return joint;
}

class VerifySampledTest : public ::testing::TestWithParam<VerifyRule> {};

TEST_P(VerifySampledTest, PreservesTheTargetDistribution) {
  const int64_t V = 5, runs = 40000;
  std::vector<gpu::SamplingParams> cases(2);
  cases[0].temperature = 1.0f;
  cases[1].temperature = 0.8f, cases[1].top_k = 4;
  for (const gpu::SamplingParams& sampling : cases) {
    const SpecRunStats s = RunSpeculative(V, 3, GetParam(), sampling, runs);
    int dof = 0;
    const double chi =
        ChiSquared(s.counts, TargetJoint(V, sampling), runs, dof);
    EXPECT_LT(chi, ChiSquaredCritical(dof))
        << "dof " << dof << " top_k " << sampling.top_k;
    EXPECT_GT(s.mean_accepted, 0.1);  // The drafts are not all rejected.
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, VerifySampledTest,
                         ::testing::Values(VerifyRule::kBlock,
                                           VerifyRule::kStandard));

// A verifier that accepted nothing would also preserve the distribution:
// the block rule accepts at least as many drafts as the per-token rule.
TEST(VerifySampledTest, BlockAcceptsAtLeastAsManyAsStandard) {
  gpu::SamplingParams sampling;
  sampling.temperature = 1.0f;
  const SpecRunStats block =
      RunSpeculative(5, 3, VerifyRule::kBlock, sampling, 20000);
  const SpecRunStats standard =
      RunSpeculative(5, 3, VerifyRule::kStandard, sampling, 20000);
  EXPECT_GE(block.mean_accepted, standard.mean_accepted - 0.01)
      << block.mean_accepted << " vs " << standard.mean_accepted;
}

// At temperature 0 both rules are the greedy rule.
TEST(VerifySampledTest, GreedyDistributionsGiveTheGreedyVerdict) {
  const int64_t V = 4;
  const std::vector<float> logits = {0, 0, 5, 0, 0, 5, 0, 0,
                                     0, 0, 0, 5, 5, 0, 0, 0};
  std::vector<std::vector<double>> target;
  target.reserve(4);
  for (int i = 0; i < 4; ++i) {
    target.push_back(SamplingDistribution(
        absl::MakeConstSpan(logits.data() + i * V, V), {}));
  }
  for (const std::vector<int64_t>& drafts :
       {std::vector<int64_t>{2, 1, 3}, std::vector<int64_t>{2, 0, 3},
        std::vector<int64_t>{1, 1, 3}}) {
    std::vector<std::vector<double>> draft;
    for (int64_t d : drafts) {
      std::vector<double> one_hot(V, 0.0);
      one_hot[d] = 1.0;
      draft.push_back(one_hot);
    }
    const Verdict g = VerifyGreedy(logits, V, drafts);
    for (VerifyRule rule : {VerifyRule::kBlock, VerifyRule::kStandard}) {
      for (uint64_t seed = 0; seed < 20; ++seed) {
        const Verdict v = VerifySampled(target, draft, drafts, rule, seed);
        EXPECT_EQ(v.accepted, g.accepted);
        EXPECT_EQ(v.next, g.next);
      }
    }
  }
}

}  // namespace
}  // namespace mneme::model
