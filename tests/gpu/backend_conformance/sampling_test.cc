// Backend conformance: sampling and log-probabilities on every backend of
// BackendFactories().

#include "gpu/sampling.h"

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
#include "gpu/cuda/host_executor.h"
#include "gpu/cuda/kernel_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_conformance/backend_factories.h"
#include "tests/gpu/backend_conformance/conformance_test_base.h"

namespace mneme::gpu::conformance {
namespace {

using SamplingTest = BackendConformanceTest;

// ---- sampling
// --------------------------------------------------------------------

double RefLogSoftmax(const std::vector<float>& row, int32_t id) {
  double max = -kInf;
  for (float v : row) max = std::max(max, double{v});
  double sum = 0;
  for (float v : row) sum += std::exp(v - max);
  return row[id] - max - std::log(sum);
}

class SampleTest : public BackendConformanceTest {
 protected:
  // Samples one row of `logits` with `params` once per seed in [0, draws).
  std::vector<int32_t> Draw(const std::vector<float>& logits,
                            SamplingParams params, int draws) {
    const int64_t vocab = logits.size();
    std::vector<float> all;
    std::vector<SamplingParams> per_row;
    for (int i = 0; i < draws; ++i) {
      all.insert(all.end(), logits.begin(), logits.end());
      params.seed = static_cast<uint64_t>(i) * 7919 + 1;
      per_row.push_back(params);
    }
    Mat lm = Upload(all, draws, vocab);
    std::vector<int32_t> ids(draws);
    std::vector<float> logprobs(draws);
    backend_->Sample(lm.view, per_row, absl::MakeSpan(ids),
                     absl::MakeSpan(logprobs));
    for (int i = 0; i < draws; ++i) {
      EXPECT_NEAR(logprobs[i], RefLogSoftmax(logits, ids[i]), 1e-5);
    }
    return ids;
  }

  // Samples rows `all` [params.size(), vocab] in one call; every token must
  // be gpu/sampling.h's SampleToken and its log-probability LogProbOf's (NaN
  // for a row with a NaN). Returns the tokens.
  std::vector<int32_t> ExpectDrawsOfTheHostSampler(
      const std::vector<float>& all, int64_t vocab,
      const std::vector<SamplingParams>& params) {
    const auto rows = static_cast<int64_t>(params.size());
    Mat lm = Upload(all, rows, vocab);
    std::vector<int32_t> ids(rows);
    std::vector<float> logprobs(rows);
    backend_->Sample(lm.view, params, absl::MakeSpan(ids),
                     absl::MakeSpan(logprobs));
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = all.data() + r * vocab;
      const int32_t want = SampleToken(row, vocab, params[r]);
      EXPECT_EQ(ids[r], want)
          << "row " << r << " top_k " << params[r].top_k << " top_p "
          << params[r].top_p << " min_p " << params[r].min_p;
      const float logprob = LogProbOf(row, vocab, want);
      if (std::isnan(logprob)) {
        EXPECT_TRUE(std::isnan(logprobs[r])) << r;
      } else {
        EXPECT_NEAR(logprobs[r], logprob, 1e-5) << r;
      }
    }
    return ids;
  }

  static std::vector<float> LogsOf(const std::vector<double>& p) {
    std::vector<float> l;
    l.reserve(p.size());
    for (double v : p) l.push_back(static_cast<float>(std::log(v)));
    return l;
  }
};

TEST_P(SampleTest, GreedyTakesTheLowestIdOfTheMaximum) {
  const std::vector<int32_t> ids =
      Draw({1.0f, 5.0f, 5.0f, 2.0f}, SamplingParams{}, 3);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 1, 1}));
}

TEST_P(SampleTest, SameSeedSameToken) {
  const std::vector<float> logits = Random(50, -0.5f, 0.5f);
  SamplingParams params{.temperature = 1.0f};
  const std::vector<int32_t> first = Draw(logits, params, 200);
  EXPECT_EQ(Draw(logits, params, 200), first);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 20u);
  // Same seed on every row of a batch: the same token on every row.
  params.seed = 42;
  Mat lm = Upload(
      [&] {
        std::vector<float> all;
        for (int i = 0; i < 4; ++i)
          all.insert(all.end(), logits.begin(), logits.end());
        return all;
      }(),
      4, 50);
  std::vector<int32_t> ids(4);
  std::vector<float> logprobs(4);
  backend_->Sample(lm.view, std::vector<SamplingParams>(4, params),
                   absl::MakeSpan(ids), absl::MakeSpan(logprobs));
  EXPECT_EQ(ids, std::vector<int32_t>(4, ids[0]));
}

TEST_P(SampleTest, TopKOneIsGreedy) {
  for (int round = 0; round < 5; ++round) {
    std::vector<float> logits = Random(100, -2, 2);
    logits[60] = logits[17] = 2.5f;  // a tie: 17 wins
    const std::vector<int32_t> ids =
        Draw(logits, SamplingParams{.temperature = 1.5f, .top_k = 1}, 50);
    EXPECT_EQ(ids, std::vector<int32_t>(50, 17));
  }
}

TEST_P(SampleTest, TopKKeepsOnlyTheBest) {
  std::vector<float> logits = Random(40, 0.0f, 1.5f);
  logits[7] = 2.0f;
  logits[3] = 1.9f;
  const std::vector<int32_t> ids =
      Draw(logits, SamplingParams{.temperature = 1.0f, .top_k = 2}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()),
            (std::set<int32_t>{3, 7}));
}

TEST_P(SampleTest, TopPKeepsTheSmallestSufficientSet) {
  const std::vector<float> logits = LogsOf({0.2, 0.5, 0.3});
  std::vector<int32_t> ids =
      Draw(logits, SamplingParams{.temperature = 1.0f, .top_p = 0.7f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()),
            (std::set<int32_t>{1, 2}));
  ids = Draw(logits, SamplingParams{.temperature = 1.0f, .top_p = 0.45f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{1}));
  // After top_k = 2 the survivors renormalise to 0.625 / 0.375: top_p 0.6
  // keeps the first alone.
  ids =
      Draw(logits,
           SamplingParams{.temperature = 1.0f, .top_p = 0.6f, .top_k = 2}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{1}));
}

// Top-p over tied weights, where the target is reached exactly: four
// tokens share the largest logit (weight 1 each, 4 in all) and the rest are
// masked; top_p 0.5 keeps the two lowest ids of the four (cumulative 2
// reaches 2), 0.6 the three lowest.
TEST_P(SampleTest, TopPReachesItsTargetExactlyOnTies) {
  const int64_t vocab = 700;
  std::vector<float> logits(vocab, -std::numeric_limits<float>::infinity());
  for (int64_t i : {650, 20, 333, 301}) logits[i] = 1.25f;
  for (auto [top_p, want] :
       {std::pair{0.5f, std::set<int32_t>{20, 301}},
        std::pair{0.6f, std::set<int32_t>{20, 301, 333}}}) {
    const std::vector<int32_t> ids =
        Draw(logits, SamplingParams{.temperature = 1.0f, .top_p = top_p}, 200);
    EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), want) << top_p;
  }
}

TEST_P(SampleTest, MinPDropsUnlikelyTokens) {
  const std::vector<float> logits = LogsOf({0.2, 0.5, 0.3});
  std::vector<int32_t> ids =
      Draw(logits, SamplingParams{.temperature = 1.0f, .min_p = 0.5f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()),
            (std::set<int32_t>{1, 2}));
  ids = Draw(logits, SamplingParams{.temperature = 1.0f, .min_p = 0.7f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{1}));
}

TEST_P(SampleTest, FrequenciesFollowTheDistribution) {
  // p = (0.75, 0.25); temperature 2 flattens it to (0.634, 0.366).
  const std::vector<float> logits = LogsOf({0.75, 0.25});
  for (auto [temperature, p0] : {std::pair{1.0f, 0.75}, {2.0f, 0.634}}) {
    const std::vector<int32_t> ids =
        Draw(logits, SamplingParams{.temperature = temperature}, 2000);
    const double zeros = std::count(ids.begin(), ids.end(), 0) / 2000.0;
    EXPECT_NEAR(zeros, p0, 0.05) << "temperature " << temperature;
  }
}

TEST_P(SamplingTest, LogProbsMatchReference) {
  const int64_t tokens = 3, vocab = 1000;
  const std::vector<float> logits = Random(tokens * vocab, -10, 10);
  const std::vector<int32_t> ids = {0, 999, 512};
  Mat lm = Upload(logits, tokens, vocab);
  std::vector<float> logprobs(tokens);
  backend_->LogProbs(lm.view, ids, absl::MakeSpan(logprobs));
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> row(logits.begin() + t * vocab,
                                 logits.begin() + (t + 1) * vocab);
    EXPECT_NEAR(logprobs[t], RefLogSoftmax(row, ids[t]), 1e-5);
  }
}

// Rows wider than one reduction lane of a device backend (vocab 1000, not
// a multiple of any power of two above 8): the maximum's lowest id wins
// across lanes (ids 299, 301 and 700 each in another lane of 4); masked (-inf)
// tokens take part; greedy and drawn rows mix in one call.
TEST_P(SampleTest, WideRowsGreedyAndDrawnInOneCall) {
  const int64_t vocab = 1000;
  const float masked = -std::numeric_limits<float>::infinity();
  std::vector<std::vector<float>> rows;
  rows.push_back(Random(vocab, -8, 8));
  rows[0][700] = rows[0][301] = rows[0][299] = 12.0f;  // -> 299
  rows.push_back(Random(vocab, -8, 8));
  rows[1][999] = 9.0f;  // the last id
  rows.push_back(Random(vocab, -8, 8));
  for (int64_t i = 0; i < vocab; i += 2) rows[2][i] = masked;
  rows[2][0] = 0.0f;
  rows[2][513] = 15.0f;  // -> 513 (drawn with top-k 1)
  rows.push_back(rows[0]);
  std::vector<float> all;
  for (const std::vector<float>& r : rows)
    all.insert(all.end(), r.begin(), r.end());
  const std::vector<SamplingParams> params = {
      SamplingParams{}, SamplingParams{},
      SamplingParams{.temperature = 0.7f, .top_k = 1, .seed = 5},
      SamplingParams{.temperature = 1.0f, .top_k = 3, .seed = 11}};
  Mat lm = Upload(all, 4, vocab);
  std::vector<int32_t> ids(4);
  std::vector<float> logprobs(4);
  backend_->Sample(lm.view, params, absl::MakeSpan(ids),
                   absl::MakeSpan(logprobs));
  EXPECT_EQ(ids[0], 299);
  EXPECT_EQ(ids[1], 999);
  EXPECT_EQ(ids[2], 513);
  EXPECT_TRUE(ids[3] == 299 || ids[3] == 301 || ids[3] == 700) << ids[3];
  for (int t = 0; t < 4; ++t) {
    EXPECT_NEAR(logprobs[t], RefLogSoftmax(rows[t], ids[t]), 1e-5) << t;
  }
  // Log-probabilities of chosen ids, the masked ones included.
  const std::vector<int32_t> scored = {999, 0, 2, 701};
  std::vector<float> got(4);
  backend_->LogProbs(lm.view, scored, absl::MakeSpan(got));
  for (int t = 0; t < 4; ++t) {
    if (std::isinf(rows[t][scored[t]])) {
      EXPECT_EQ(got[t], masked) << t;
    } else {
      EXPECT_NEAR(got[t], RefLogSoftmax(rows[t], scored[t]), 1e-5) << t;
    }
  }
}

// Every drawn token equals gpu/sampling.h's SampleToken on the same row,
// and its log-probability LogProbOf's, over rows wider than a reduction
// lane: plain and tie-heavy logits (equal weights at the top-k and top-p
// cuts), masked and NaN tokens, every filter alone and together, and the
// filters' edges (top-k 1 and vocab - 1, top-p 0, min-p 1). A device's
// partial sums differ from the host's only in rounding, so a draw could
// differ only where its uniform falls within rounding of a boundary; none
// of these rows' does.
TEST_P(SampleTest, DrawsEqualTheHostSampler) {
  const int64_t vocab = 3001;
  const std::vector<int32_t> top_ks = {0, 1, 5, 40, 3000, 5000};
  const std::vector<float> top_ps = {1.0f, 0.9f, 0.5f, 0.05f, 0.0f};
  const std::vector<float> min_ps = {0.0f, 0.05f, 0.5f, 1.0f};
  const std::vector<float> temperatures = {0.5f, 1.0f, 2.0f};
  std::mt19937 rng(7);
  std::vector<float> all;
  std::vector<SamplingParams> params;
  for (int r = 0; r < 96; ++r) {
    std::vector<float> row = Random(vocab, -4.0f, 4.0f);
    if (r % 3 == 1) {
      // Ties: a few distinct values, the best shared by many tokens.
      for (float& v : row) v = std::round(v) * 0.5f;
    }
    if (r % 4 == 2) {
      for (int64_t i = 3; i < vocab; i += 7) {
        row[i] = -std::numeric_limits<float>::infinity();
      }
      row[100] = std::numeric_limits<float>::quiet_NaN();
    }
    all.insert(all.end(), row.begin(), row.end());
    SamplingParams p{.temperature = temperatures[r % temperatures.size()],
                     .seed = rng()};
    switch (r % 4) {
      case 0:
        p.top_k = top_ks[rng() % top_ks.size()];
        break;
      case 1:
        p.top_p = top_ps[rng() % top_ps.size()];
        break;
      case 2:
        p.min_p = min_ps[rng() % min_ps.size()];
        break;
      default:
        p.top_k = top_ks[rng() % top_ks.size()];
        p.top_p = top_ps[rng() % top_ps.size()];
        p.min_p = min_ps[rng() % min_ps.size()];
    }
    params.push_back(p);
  }
  const std::vector<int32_t> ids =
      ExpectDrawsOfTheHostSampler(all, vocab, params);
  EXPECT_GT(std::set<int32_t>(ids.begin(), ids.end()).size(), 40u);
}

// The same over rows of more reduction lanes than a warp has (40,000
// tokens: 157 lanes of 256), where each lane of the kernel backend's digit
// pick sums several histogram lanes: top-k and top-p alone and together,
// plain and tie-heavy rows.
TEST_P(SampleTest, DrawsOfRowsWiderThanAWarpOfLanesEqualTheHostSampler) {
  const int64_t vocab = 40000;
  const std::vector<int32_t> top_ks = {1, 50, 1000, 39999};
  const std::vector<float> top_ps = {0.9f, 0.5f, 0.05f};
  std::mt19937 rng(11);
  std::vector<float> all;
  std::vector<SamplingParams> params;
  for (int r = 0; r < 16; ++r) {
    std::vector<float> row = Random(vocab, -6.0f, 6.0f);
    if (r % 2 == 1) {
      for (float& v : row) v = std::round(v) * 0.5f;
    }
    all.insert(all.end(), row.begin(), row.end());
    SamplingParams p{.temperature = r % 3 == 0 ? 0.6f : 1.0f, .seed = rng()};
    if (r % 4 != 1) p.top_k = top_ks[rng() % top_ks.size()];
    if (r % 4 != 0) p.top_p = top_ps[rng() % top_ps.size()];
    params.push_back(p);
  }
  ExpectDrawsOfTheHostSampler(all, vocab, params);
}

// A NaN logit past the first never wins greedy selection and does not hide
// the values after it (the CPU backend's std::max_element rule).
TEST_P(SampleTest, GreedyIgnoresALaterNan) {
  const int64_t vocab = 1000;
  std::vector<float> row = Random(vocab, -1, 1);
  row[1] = std::numeric_limits<float>::quiet_NaN();
  row[513] = 6.0f;
  row[514] = 4.0f;
  Mat lm = Upload(row, 1, vocab);
  std::vector<int32_t> ids(1);
  std::vector<float> logprobs(1);
  backend_->Sample(lm.view, std::vector<SamplingParams>(1), absl::MakeSpan(ids),
                   absl::MakeSpan(logprobs));
  EXPECT_EQ(ids[0], 513);
}

// Rows whose maximum is not finite are greedy even at a temperature, and
// their log-probabilities follow log_softmax's IEEE arithmetic: a NaN first
// value is the CPU backend's maximum (std::max_element), +inf makes every
// finite token -inf and the infinite ones NaN, an all -inf row is NaN.
TEST_P(SampleTest, NonFiniteRows) {
  const int64_t vocab = 600;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> all = Random(3 * vocab, -1, 1);
  all[0] = std::numeric_limits<float>::quiet_NaN();
  all[vocab + 10] = all[vocab + 520] = inf;
  std::fill(all.begin() + 2 * vocab, all.end(), -inf);
  Mat lm = Upload(all, 3, vocab);
  for (float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(temperature);
    std::vector<int32_t> ids(3);
    std::vector<float> logprobs(3);
    backend_->Sample(lm.view,
                     std::vector<SamplingParams>(
                         3, SamplingParams{.temperature = temperature}),
                     absl::MakeSpan(ids), absl::MakeSpan(logprobs));
    EXPECT_EQ(ids, (std::vector<int32_t>{0, 10, 0}));
    for (float lp : logprobs) EXPECT_TRUE(std::isnan(lp)) << lp;
  }
  std::vector<float> got(3);
  backend_->LogProbs(lm.view, std::vector<int32_t>{5, 5, 5},
                     absl::MakeSpan(got));
  EXPECT_TRUE(std::isnan(got[0])) << got[0];
  EXPECT_EQ(got[1], -inf);
  EXPECT_TRUE(std::isnan(got[2])) << got[2];
}

// The CUDA backend's op code (host executor) drawing rows a few at a time
// (a weight budget of two rows a pass): each row's token and log-probability
// equal SampleToken's and LogProbOf's, with greedy rows between drawn ones
// and a row whose kept tokens weigh nothing (min-p above 1: the argmax).
TEST(KernelBackendSampleTest, DrawsRowsInPassesOfTheWeightBudget) {
  constexpr int64_t kVocab = 1000;
  KernelBackend::Options options;
  options.sample_weight_bytes = 2 * kVocab * 8 + 8;
  KernelBackend backend(MakeHostExecutor(), options);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> logit(-3.0f, 3.0f);
  std::vector<float> all(7 * kVocab);
  for (float& v : all) v = logit(rng);
  const std::vector<SamplingParams> params = {
      {.temperature = 1.0f, .seed = 1},
      {},
      {.temperature = 0.7f, .top_p = 0.8f, .seed = 2},
      {.temperature = 1.3f, .top_k = 20, .seed = 3},
      {.temperature = 1.0f, .min_p = 1.5f, .seed = 4},
      {},
      {.temperature = 2.0f,
       .top_p = 0.5f,
       .top_k = 100,
       .min_p = 0.1f,
       .seed = 5}};
  absl::StatusOr<std::unique_ptr<Buffer>> logits =
      backend.Allocate(static_cast<int64_t>(all.size()));
  ASSERT_TRUE(logits.ok()) << logits.status();
  backend.CopyFromHost(all, (*logits)->data());
  std::vector<int32_t> ids(params.size());
  std::vector<float> logprobs(params.size());
  backend.Sample(ConstMatrixView((*logits)->data(),
                                 static_cast<int64_t>(params.size()), kVocab),
                 params, absl::MakeSpan(ids), absl::MakeSpan(logprobs));
  for (size_t r = 0; r < params.size(); ++r) {
    const float* row = all.data() + r * kVocab;
    const int32_t want = SampleToken(row, kVocab, params[r]);
    EXPECT_EQ(ids[r], want) << r;
    EXPECT_NEAR(logprobs[r], LogProbOf(row, kVocab, want), 1e-5) << r;
  }
  EXPECT_EQ(ids[4], std::max_element(all.begin() + 4 * kVocab,
                                     all.begin() + 5 * kVocab) -
                        (all.begin() + 4 * kVocab));
}

INSTANTIATE_TEST_SUITE_P(Backends, SamplingTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);
INSTANTIATE_TEST_SUITE_P(Backends, SampleTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
