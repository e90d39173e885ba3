// Backend conformance: attention and softmax pooling on every backend of
// BackendFactories().

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
#include <tuple>
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

using AttentionTest = BackendConformanceTest;

// The keys of one query: up to two ranges [begin, end), which may overlap
// (a key in both counts once).
struct KeyRanges {
  int32_t begin[2] = {0, 0};
  int32_t end[2] = {0, 0};
};

// SparseAttention's key lists for `ranges`: every key once, ascending, -1
// padded to the longest list (`width`).
std::vector<int32_t> KeyLists(const std::vector<KeyRanges>& ranges,
                              int* width) {
  std::vector<std::set<int32_t>> keys(ranges.size());
  size_t longest = 0;
  for (size_t t = 0; t < ranges.size(); ++t) {
    for (int i = 0; i < 2; ++i) {
      for (int32_t j = ranges[t].begin[i]; j < ranges[t].end[i]; ++j) {
        keys[t].insert(j);
      }
    }
    longest = std::max(longest, keys[t].size());
  }
  *width = static_cast<int>(longest);
  std::vector<int32_t> idx(ranges.size() * longest, -1);
  for (size_t t = 0; t < ranges.size(); ++t) {
    size_t n = 0;
    for (const int32_t j : keys[t]) idx[t * longest + n++] = j;
  }
  return idx;
}

// ---- attention
// -----------------------------------------------------------------

// Double-precision attention for one (token, head): out and lse.
void RefAttention(const std::vector<float>& q, const std::vector<float>& kv,
                  int64_t hd, int heads, const std::vector<KeyRanges>& ranges,
                  double scale, const std::vector<float>* sink,
                  std::vector<double>* out, std::vector<double>* lse) {
  const int64_t tokens = ranges.size();
  out->assign(tokens * heads * hd, 0.0);
  lse->assign(tokens * heads, -kInf);
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> keys;
    for (int i = 0; i < 2; ++i) {
      for (int32_t j = ranges[t].begin[i]; j < ranges[t].end[i]; ++j) {
        keys.insert(j);
      }
    }
    if (keys.empty()) continue;
    for (int h = 0; h < heads; ++h) {
      std::vector<double> s;
      for (int32_t j : keys) {
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) {
          dot += double{q[t * heads * hd + h * hd + i]} * kv[j * hd + i];
        }
        s.push_back(scale * dot);
      }
      const double max = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double v : s) sum += std::exp(v - max);
      const double l = max + std::log(sum);
      (*lse)[t * heads + h] = l;
      const double gate = sink ? RefSigmoid(l - (*sink)[h]) : 1.0;
      size_t n = 0;
      for (int32_t j : keys) {
        const double p = std::exp(s[n++] - l);
        for (int64_t i = 0; i < hd; ++i) {
          (*out)[t * heads * hd + h * hd + i] += gate * p * kv[j * hd + i];
        }
      }
    }
  }
}

TEST_P(AttentionTest, SparseAttentionMatchesReference) {
  struct Case {
    int64_t tokens;
    int heads;
    int64_t hd, keys;
  };
  for (const Case& c :
       {Case{1, 1, 7, 1}, Case{1, 8, 64, 300}, Case{4, 3, 7, 40},
        Case{9, 2, 33, 260}, Case{3, 4, 16, 0},
        // The CUDA backend's warp attention: 16 dimensions a lane at V4's
        // 512, some lanes short of a dimension, and a head above 512 (one
        // thread per head instead).
        Case{3, 2, 512, 50}, Case{4, 3, 100, 70}, Case{2, 2, 520, 30}}) {
    SCOPED_TRACE(testing::Message()
                 << c.tokens << " " << c.heads << " " << c.hd << " " << c.keys);
    const std::vector<float> q = Random(c.tokens * c.heads * c.hd, -2, 2);
    const std::vector<float> kv = Random(c.keys * c.hd, -2, 2);
    std::vector<KeyRanges> ranges(c.tokens);
    std::uniform_int_distribution<int32_t> key(0, static_cast<int32_t>(c.keys));
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int i = 0; i < 2; ++i) {
        int32_t a = key(rng_), b = key(rng_);
        if (a > b) std::swap(a, b);
        ranges[t].begin[i] = a;
        ranges[t].end[i] = b;
      }
    }
    if (c.tokens > 1 && c.keys > 10) {
      // KeyRanges{{begin0, begin1}, {end0, end1}}.
      ranges[0] = KeyRanges{{0, 0}, {0, 0}};      // nothing visible
      ranges[1] = KeyRanges{{2, 4}, {5, 10}};     // [2, 5) and [4, 10) overlap
      ranges.back() = KeyRanges{{0, 3}, {7, 3}};  // [0, 7), the second empty
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
    const std::vector<float> sink = Random(c.heads, -1, 3);
    Mat qm = Upload(q, c.tokens, c.heads * c.hd);
    Mat kvm = Upload(kv, c.keys, c.hd);
    Mat sinkm = Upload(sink, 1, c.heads);
    Mat out = Zeros(c.tokens, c.heads * c.hd), lse = Zeros(c.tokens, c.heads);
    std::vector<double> ref_out, ref_lse;

    int width = 0;
    const std::vector<int32_t> idx = KeyLists(ranges, &width);
    RefAttention(q, kv, c.hd, c.heads, ranges, scale, nullptr, &ref_out,
                 &ref_lse);
    backend_->SparseAttention(qm.view, kvm.view, c.heads, idx, width,
                              static_cast<float>(scale), nullptr, out.view,
                              lse.view);
    ExpectAllNear(Download(out), ref_out, 1e-5);
    const std::vector<float> got_lse = Download(lse);
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      if (std::isinf(ref_lse[i])) {
        EXPECT_EQ(got_lse[i], -std::numeric_limits<float>::infinity());
      } else {
        EXPECT_NEAR(got_lse[i], ref_lse[i], 1e-5);
      }
    }
    const std::vector<float> no_sink_out = Download(out);

    // With the sink: the reference, the same lse, and the same as applying it
    // afterwards.
    RefAttention(q, kv, c.hd, c.heads, ranges, scale, &sink, &ref_out,
                 &ref_lse);
    backend_->SparseAttention(qm.view, kvm.view, c.heads, idx, width,
                              static_cast<float>(scale), sinkm.data(), out.view,
                              lse.view);
    ExpectAllNear(Download(out), ref_out, 1e-5);
    EXPECT_EQ(Download(lse), got_lse);
    Mat applied = Upload(no_sink_out, c.tokens, c.heads * c.hd);
    backend_->ApplySink(lse.view, sinkm.data(), applied.view);
    EXPECT_EQ(Download(applied), Download(out));
  }
}

TEST_P(AttentionTest, SparseAttentionWithNoKeyGivesZerosAndMinusInf) {
  const std::vector<KeyRanges> ranges = {KeyRanges{{3, 0}, {3, 0}},
                                         KeyRanges{}};
  Mat q = Upload(Random(int64_t{2} * 2 * 8), 2, 16);
  Mat kv = Upload(Random(int64_t{6} * 8), 6, 8);
  Mat sink = Upload({0.5f, -0.5f}, 1, 2);
  for (const float* s : {static_cast<const float*>(nullptr),
                         static_cast<const float*>(sink.data())}) {
    Mat out = Upload(std::vector<float>(size_t{2} * 16, 9.0f), 2, 16);
    Mat lse = Zeros(2, 2);
    int width = 0;
    const std::vector<int32_t> idx = KeyLists(ranges, &width);
    backend_->SparseAttention(q.view, kv.view, 2, idx, width, 0.3f, s, out.view,
                              lse.view);
    EXPECT_EQ(Download(out), std::vector<float>(size_t{2} * 16, 0.0f));
    EXPECT_EQ(Download(lse),
              std::vector<float>(4, -std::numeric_limits<float>::infinity()));
  }
}

TEST_P(AttentionTest, SoftmaxPoolMatchesReference) {
  // (entries, r, d): one entry and several, each pooling its own rows with
  // the one ape.
  for (const std::tuple<int64_t, int64_t, int64_t>& shape :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {1, 4, 9}, {1, 7, 64}, {3, 4, 9}, {5, 8, 33}}) {
    const int64_t entries = std::get<0>(shape), r = std::get<1>(shape),
                  d = std::get<2>(shape);
    SCOPED_TRACE(testing::Message()
                 << entries << " entries of " << r << " x " << d);
    const std::vector<float> kv = Random(entries * r * d),
                             score = Random(entries * r * d, -4, 4),
                             ape = Random(r * d);
    std::vector<double> ref(entries * d);
    for (int64_t e = 0; e < entries; ++e) {
      for (int64_t c = 0; c < d; ++c) {
        const auto at = [&](const std::vector<float>& m, int64_t i) {
          return double{m[(e * r + i) * d + c]};
        };
        double max = -kInf;
        for (int64_t i = 0; i < r; ++i) {
          max = std::max(max, at(score, i) + ape[i * d + c]);
        }
        double num = 0, den = 0;
        for (int64_t i = 0; i < r; ++i) {
          const double x = std::exp(at(score, i) + ape[i * d + c] - max);
          den += x;
          num += x * at(kv, i);
        }
        ref[e * d + c] = num / den;
      }
    }
    Mat kvm = Upload(kv, entries * r, d), sm = Upload(score, entries * r, d),
        am = Upload(ape, r, d);
    Mat out = Zeros(entries, d);
    backend_->SoftmaxPool(kvm.view, sm.view, am.view, out.view);
    ExpectAllNear(Download(out), ref, 1e-6);
  }
}

// Double-precision attention over per-query key lists idx [T, width] (-1 =
// none, a row listed twice counting twice), with the sink when not null.
void RefListAttention(const std::vector<float>& q, const std::vector<float>& kv,
                      int64_t hd, int heads, const std::vector<int32_t>& idx,
                      int width, double scale, const std::vector<float>* sink,
                      std::vector<double>* out, std::vector<double>* lse) {
  const int64_t tokens = static_cast<int64_t>(idx.size()) / width;
  out->assign(tokens * heads * hd, 0.0);
  lse->assign(tokens * heads, -kInf);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      std::vector<double> s;
      std::vector<int32_t> rows;
      for (int j = 0; j < width; ++j) {
        const int32_t r = idx[t * width + j];
        if (r < 0) continue;
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) {
          dot += double{q[(t * heads + h) * hd + i]} * kv[r * hd + i];
        }
        s.push_back(dot * scale);
        rows.push_back(r);
      }
      if (s.empty()) continue;
      double* o = &(*out)[(t * heads + h) * hd];
      const double m = *std::max_element(s.begin(), s.end());
      double den = 0;
      for (double v : s) den += std::exp(v - m);
      (*lse)[t * heads + h] = m + std::log(den);
      const double total =
          den + (sink != nullptr ? std::exp(double{(*sink)[h]} - m) : 0.0);
      for (size_t j = 0; j < s.size(); ++j) {
        const double p = std::exp(s[j] - m) / total;
        for (int64_t i = 0; i < hd; ++i) o[i] += p * kv[rows[j] * hd + i];
      }
    }
  }
}

// out and lse against a double-precision reference (an lse of -inf
// exactly).
void ExpectAttentionNear(const std::vector<float>& out,
                         const std::vector<float>& lse,
                         const std::vector<double>& ref_out,
                         const std::vector<double>& ref_lse, double tol) {
  ExpectAllNear(out, ref_out, tol);
  ASSERT_EQ(lse.size(), ref_lse.size());
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref_lse[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << i;
    } else {
      EXPECT_NEAR(lse[i], ref_lse[i], tol) << i;
    }
  }
}

// The official sparse_attn: per query its own key list (-1 = none), a
// softmax with the sink's logit in the denominator.
TEST_P(AttentionTest, SparseAttentionOverPerQueryKeyLists) {
  const int heads = 3;
  const int64_t hd = 20, keys = 11, tokens = 4;
  const int width = 5;
  const std::vector<float> q = Random(tokens * heads * hd);
  const std::vector<float> kv = Random(keys * hd);
  const std::vector<float> sink = {0.5f, -1.0f, 2.0f};
  // Query 2 has no key at all; query 3 lists a key twice.
  const std::vector<int32_t> idx = {0,  4,  10, -1, 7,   //
                                    -1, -1, 3,  -1, -1,  //
                                    -1, -1, -1, -1, -1,  //
                                    2,  2,  9,  1,  0};
  const float scale = 0.3f;
  for (const bool with_sink : {false, true}) {
    std::vector<double> ref_out, ref_lse;
    RefListAttention(q, kv, hd, heads, idx, width, scale,
                     with_sink ? &sink : nullptr, &ref_out, &ref_lse);
    Mat qm = Upload(q, tokens, heads * hd), km = Upload(kv, keys, hd);
    Mat sm = Upload(sink, 1, heads);
    Mat out = Zeros(tokens, heads * hd), lse = Zeros(tokens, heads);
    backend_->SparseAttention(qm.view, km.view, heads, idx, width, scale,
                              with_sink ? sm.data() : nullptr, out.view,
                              lse.view);
    ExpectAttentionNear(Download(out), Download(lse), ref_out, ref_lse, 1e-5);
  }
}

// The indexer's score: sum_h w_h relu(q_h . k), keys read in place from
// rows of a wider matrix, the same rows for every query or each query its
// own (several sequences' decode queries), a row -1 scoring 0. Shapes for
// the CUDA backend's tiles (64 entries a tile, 64 heads a round, index heads
// up to 128 dimensions): V4's 64 heads of 128, entries ragged over three
// tiles, more heads than a round, and heads above 128 dimensions (one
// thread per score instead).
TEST_P(AttentionTest, IndexScoresOfKeyRowsInPlace) {
  struct Case {
    int64_t heads, d, tokens, n;
  };
  for (const bool per_query : {false, true}) {
    for (const Case& c :
         {Case{4, 16, 3, 5}, Case{64, 128, 2, 150}, Case{70, 33, 3, 65},
          Case{3, 130, 2, 10}, Case{1, 1, 1, 1}}) {
      SCOPED_TRACE(testing::Message()
                   << c.heads << " heads of " << c.d << ", " << c.tokens
                   << " x " << c.n << (per_query ? ", rows per query" : ""));
      const int64_t width = c.d + 8;
      const int64_t pool_rows = c.n + 4;
      const std::vector<float> q = Random(c.tokens * c.heads * c.d);
      const std::vector<float> w = Random(c.tokens * c.heads);
      const std::vector<float> pool = Random(pool_rows * width);
      // Rows in a shuffled order, some twice, some -1 (not the only one).
      std::vector<int32_t> rows(per_query ? c.tokens * c.n : c.n);
      std::uniform_int_distribution<int32_t> row(
          -1, static_cast<int32_t>(pool_rows - 1));
      for (int32_t& r : rows) r = row(rng_);
      if (rows.size() > 1) rows[1] = -1;
      const auto row_of = [&](int64_t t, int64_t j) {
        return rows[(per_query ? t * c.n : 0) + j];
      };
      std::vector<double> ref(c.tokens * c.n, 0.0);
      double tolerance = 0.0;
      for (int64_t t = 0; t < c.tokens; ++t) {
        for (int64_t j = 0; j < c.n; ++j) {
          const int32_t r = row_of(t, j);
          if (r < 0) continue;
          double magnitude = 0.0;
          for (int64_t h = 0; h < c.heads; ++h) {
            double dot = 0, dot_magnitude = 0;
            for (int64_t i = 0; i < c.d; ++i) {
              const double p =
                  double{q[(t * c.heads + h) * c.d + i]} * pool[r * width + i];
              dot += p;
              dot_magnitude += std::fabs(p);
            }
            ref[t * c.n + j] += w[t * c.heads + h] * std::max(dot, 0.0);
            magnitude += std::fabs(w[t * c.heads + h]) * dot_magnitude;
          }
          tolerance = std::max(tolerance, 1e-6 * magnitude);
        }
      }
      Mat qm = Upload(q, c.tokens, c.heads * c.d);
      Mat wm = Upload(w, c.tokens, c.heads);
      Mat pm = Upload(pool, pool_rows, width);
      Mat out = Upload(std::vector<float>(c.tokens * c.n, std::nanf("")),
                       c.tokens, c.n);
      backend_->IndexScores(qm.view, wm.view, pm.view, rows, out.view);
      const std::vector<float> got = Download(out);
      ExpectAllNear(got, ref, tolerance + 1e-6);
      for (int64_t t = 0; t < c.tokens; ++t) {
        for (int64_t j = 0; j < c.n; ++j) {
          if (row_of(t, j) < 0) {
            EXPECT_EQ(got[t * c.n + j], 0.0f) << t << ", " << j;
          }
        }
      }
    }
  }
}

// ---- indexer top-k -------------------------------------------------------

// SelectTopK's choice by its definition: every eligible entry sorted by
// (not NaN, larger fp32 score * scale, lower id), the first k, ascending.
void RefSelectTopK(const std::vector<float>& scores, int64_t cols, float scale,
                   const std::vector<int64_t>& visible, int k,
                   const std::vector<int32_t>& blocks, int blocks_per_row,
                   int block_size, std::vector<int32_t>* ids,
                   std::vector<int32_t>* counts) {
  const int64_t rows = static_cast<int64_t>(visible.size());
  ids->assign(rows * k, -1);
  counts->assign(rows, 0);
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<int32_t> eligible;
    for (int64_t e = 0; e < std::min(cols, visible[t]); ++e) {
      bool in = blocks_per_row == 0;
      for (int j = 0; j < blocks_per_row; ++j) {
        in = in || blocks[t * blocks_per_row + j] == e / block_size;
      }
      if (in) eligible.push_back(static_cast<int32_t>(e));
    }
    const auto value = [&](int32_t e) { return scores[t * cols + e] * scale; };
    std::sort(eligible.begin(), eligible.end(), [&](int32_t a, int32_t b) {
      const float va = value(a);
      const float vb = value(b);
      if (std::isnan(va) || std::isnan(vb)) {
        return std::isnan(va) == std::isnan(vb) ? a < b : std::isnan(vb);
      }
      return va > vb || (va == vb && a < b);
    });
    eligible.resize(std::min<size_t>(eligible.size(), k));
    std::sort(eligible.begin(), eligible.end());
    std::copy(eligible.begin(), eligible.end(), ids->begin() + t * k);
    (*counts)[t] = static_cast<int32_t>(eligible.size());
  }
}

// SelectTopK of `m` (holding `scores`) on the backend against
// RefSelectTopK, exactly.
void ExpectSelectTopK(Backend& backend, const Mat& m,
                      const std::vector<float>& scores, int64_t cols,
                      float scale, const std::vector<int64_t>& visible, int k,
                      const std::vector<int32_t>& blocks, int blocks_per_row,
                      int block_size) {
  const int64_t rows = static_cast<int64_t>(visible.size());
  std::vector<int32_t> want_ids, want_counts;
  RefSelectTopK(scores, cols, scale, visible, k, blocks, blocks_per_row,
                block_size, &want_ids, &want_counts);
  std::vector<int32_t> ids(rows * k, 7), counts(rows, 7);
  backend.SelectTopK(m.view, scale, visible, k, blocks, blocks_per_row,
                     block_size, absl::MakeSpan(ids), absl::MakeSpan(counts));
  EXPECT_EQ(counts, want_counts);
  for (int64_t t = 0; t < rows; ++t) {
    EXPECT_EQ(
        std::vector<int32_t>(ids.begin() + t * k, ids.begin() + (t + 1) * k),
        std::vector<int32_t>(want_ids.begin() + t * k,
                             want_ids.begin() + (t + 1) * k))
        << "row " << t;
  }
}

// Scores from a few levels (ties spanning the kRowLane-entry segments of a
// device row), signed zeros, infinities, NaNs, denormals and large values.
std::vector<float> TiedScores(int64_t n, uint32_t seed) {
  const float levels[] = {-2.0f,
                          -0.5f,
                          -0.0f,
                          0.0f,
                          0.5f,
                          1.0f,
                          3.0f,
                          1e30f,
                          -1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min()};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 13);
  std::vector<float> v(n);
  for (float& x : v) x = levels[pick(rng)];
  return v;
}

TEST_P(AttentionTest, SelectTopKOfTiedAndNonFiniteScores) {
  const int64_t cols = 1000;
  const std::vector<int64_t> visible = {1000, 700, 0, 5000, 50, 999, 1, 257};
  const int64_t rows = static_cast<int64_t>(visible.size());
  const std::vector<float> scores = TiedScores(rows * cols, 11);
  const Mat m = Upload(scores, rows, cols);
  for (const int k : {1, 100, 333, 1200}) {
    SCOPED_TRACE(k);
    ExpectSelectTopK(*backend_, m, scores, cols, 0.37f, visible, k, {}, 0, 1);
  }
}

TEST_P(AttentionTest, SelectTopKOfOneSegmentAndOfMany) {
  // One device segment (fewer entries than kRowLane) and 36 of them, a
  // negative visible count and a NaN with the sign bit set.
  for (const int64_t cols : {int64_t{200}, int64_t{9000}}) {
    SCOPED_TRACE(cols);
    const std::vector<int64_t> visible = {cols, -3, cols - 7, cols / 3};
    const auto rows = static_cast<int64_t>(visible.size());
    std::vector<float> scores = TiedScores(rows * cols, 31);
    scores[1] = -std::numeric_limits<float>::quiet_NaN();
    scores[2 * cols + 3] = -std::numeric_limits<float>::quiet_NaN();
    const Mat m = Upload(scores, rows, cols);
    for (const int k : {1, 16, 199, 2048}) {
      SCOPED_TRACE(k);
      ExpectSelectTopK(*backend_, m, scores, cols, 1.5f, visible, k, {}, 0, 1);
    }
  }
}

TEST_P(AttentionTest, SelectTopKOfDistinctScoresAndScaledTies) {
  // Continuous values: every digit of the keys matters. Then values that
  // differ but tie once scaled (the choice is made on score * scale).
  const int64_t cols = 777;
  const std::vector<int64_t> visible = {777, 600, 777};
  std::vector<float> scores = Random(3 * cols, -50.0f, 50.0f);
  for (int64_t e = 0; e < cols; ++e) {
    scores[2 * cols + e] = 1.0f + static_cast<float>(e % 3) * 1e-7f;
  }
  scores[5] = scores[cols + 5] = 1e-40f;
  const Mat m = Upload(scores, 3, cols);
  for (const int k : {1, 64, 512}) {
    SCOPED_TRACE(k);
    ExpectSelectTopK(*backend_, m, scores, cols, 1.0f, visible, k, {}, 0, 1);
    ExpectSelectTopK(*backend_, m, scores, cols, 1e-44f, visible, k, {}, 0, 1);
  }
}

TEST_P(AttentionTest, SelectTopKWithinCandidateBlocks) {
  const int64_t cols = 1100;
  const int block_size = 64;
  const int blocks_per_row = 5;
  const std::vector<int64_t> visible = {1100, 900, 1100, 1100, 10};
  const std::vector<int32_t> blocks = {
      0,  3,  7,  15, -1,  //
      2,  13, 14, -1, -1,  // block 14 is past visible 900
      -1, -1, -1, -1, -1,  // no candidate: nothing eligible
      1,  2,  3,  4,  17,  // the last block is partial (1088..1099)
      0,  -1, -1, -1, -1};
  const auto rows = static_cast<int64_t>(visible.size());
  const std::vector<float> scores = TiedScores(rows * cols, 5);
  const Mat m = Upload(scores, rows, cols);
  for (const int k : {1, 40, 130, 400}) {
    SCOPED_TRACE(k);
    ExpectSelectTopK(*backend_, m, scores, cols, 0.25f, visible, k, blocks,
                     blocks_per_row, block_size);
  }
}

// SelectCandidateBlocks' choice by its definition: block maxima of the
// scaled scores (NaN ignored), the newest visible block +inf, every block
// above -inf sorted by (score, lower block), the first topk_blocks,
// ascending.
void RefCandidateBlocks(const std::vector<float>& scores, int64_t cols,
                        float scale, const std::vector<int64_t>& visible,
                        int topk_blocks, int block_size,
                        std::vector<int32_t>* blocks,
                        std::vector<int32_t>* counts) {
  const int64_t rows = static_cast<int64_t>(visible.size());
  blocks->assign(rows * topk_blocks, -1);
  counts->assign(rows, 0);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t v = std::min(cols, visible[t]);
    std::vector<std::pair<float, int32_t>> scored;
    for (int64_t b = 0; b * block_size < v; ++b) {
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t e = b * block_size; e < std::min(v, (b + 1) * block_size);
           ++e) {
        const float x = scores[t * cols + e] * scale;
        if (!std::isnan(x)) best = std::max(best, x);
      }
      if ((v - 1) / block_size == b) {
        best = std::numeric_limits<float>::infinity();
      }
      if (best > -std::numeric_limits<float>::infinity()) {
        scored.emplace_back(best, static_cast<int32_t>(b));
      }
    }
    std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    std::vector<int32_t> chosen;
    for (size_t i = 0; i < scored.size() && i < size_t(topk_blocks); ++i) {
      chosen.push_back(scored[i].second);
    }
    std::sort(chosen.begin(), chosen.end());
    std::copy(chosen.begin(), chosen.end(), blocks->begin() + t * topk_blocks);
    (*counts)[t] = static_cast<int32_t>(chosen.size());
  }
}

// ChooseAndAttend: each query attends its fixed keys, then the rows of the
// entries SelectTopK chooses from its scores (ties, infinities and NaNs
// among them; entries of other ranks -1; a row choosing nothing, one
// choosing everything it sees, one seeing more than there are), against
// the choice by its definition and a double-precision attention over the
// lists it names, and bit for bit against SelectTopK then SparseAttention
// over those lists on the same backend. Shapes for each way the CUDA
// backend attends: warps over whole lists, lists split over blocks (200
// chosen), and heads of more than 512 dimensions.
TEST_P(AttentionTest, ChooseAndAttendAttendsTheChosenEntriesRows) {
  const int heads = 3;
  const int64_t entries = 300, pool = 64;
  const std::vector<int64_t> visible = {300, 37, 0, 299, 5, 1000};
  const auto tokens = static_cast<int64_t>(visible.size());
  const std::vector<float> scores = TiedScores(tokens * entries, 5);
  // Entry rows: a row of the pool, or -1 for one in seven (another rank's).
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> row_of(0, pool - 1);
  std::vector<int32_t> entry_rows(tokens * entries);
  for (size_t i = 0; i < entry_rows.size(); ++i) {
    entry_rows[i] = i % 7 == 3 ? -1 : row_of(rng);
  }
  const std::vector<float> sink = {0.5f, -1.0f, 2.0f};
  Mat sm = Upload(sink, 1, heads);
  const Mat scores_m = Upload(scores, tokens, entries);
  const float index_scale = 0.7f, scale = 0.25f;
  struct Case {
    int64_t hd;
    int k;
    int fixed_width;
    bool with_sink;
  };
  // The last: no fixed keys (a DCP rank holding none of the window) and no
  // sink (DCP's partial attention), so the row seeing no entry has no key
  // at all.
  for (const Case& c :
       {Case{20, 1, 4, true}, Case{20, 16, 4, true}, Case{20, 200, 4, true},
        Case{520, 16, 4, true}, Case{20, 16, 0, false}}) {
    SCOPED_TRACE(testing::Message() << "hd " << c.hd << ", k " << c.k
                                    << ", fixed " << c.fixed_width);
    const int64_t hd = c.hd;
    const int k = c.k, fixed_width = c.fixed_width;
    std::vector<int32_t> fixed(tokens * fixed_width);
    for (size_t i = 0; i < fixed.size(); ++i) {
      fixed[i] = i % 5 == 1 ? -1 : row_of(rng);
    }
    const std::vector<float> q = Random(tokens * heads * hd);
    const std::vector<float> kv = Random(pool * hd);
    const Mat qm = Upload(q, tokens, heads * hd), km = Upload(kv, pool, hd);
    // The lists the choice names.
    std::vector<int32_t> ids, counts;
    RefSelectTopK(scores, entries, index_scale, visible, k, {}, 0, 1, &ids,
                  &counts);
    const int width = fixed_width + k;
    std::vector<int32_t> idx(tokens * width, -1);
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy_n(fixed.begin() + t * fixed_width, fixed_width,
                  idx.begin() + t * width);
      for (int32_t j = 0; j < counts[t]; ++j) {
        idx[t * width + fixed_width + j] =
            entry_rows[t * entries + ids[t * k + j]];
      }
    }
    std::vector<double> ref_out, ref_lse;
    RefListAttention(q, kv, hd, heads, idx, width, scale,
                     c.with_sink ? &sink : nullptr, &ref_out, &ref_lse);
    const float* sink_data = c.with_sink ? sm.data() : nullptr;
    Mat out = Zeros(tokens, heads * hd), lse = Zeros(tokens, heads);
    backend_->ChooseAndAttend(
        scores_m.view, index_scale, visible, k, entry_rows, qm.view, km.view,
        heads, fixed, fixed_width, scale, sink_data, out.view, lse.view);
    const std::vector<float> got_out = Download(out), got_lse = Download(lse);
    ExpectAttentionNear(got_out, got_lse, ref_out, ref_lse, 1e-5);
    // The same calls the choice coming back would make.
    std::vector<int32_t> back_ids(tokens * k), back_counts(tokens);
    backend_->SelectTopK(scores_m.view, index_scale, visible, k, {}, 0, 1,
                         absl::MakeSpan(back_ids), absl::MakeSpan(back_counts));
    ASSERT_EQ(back_ids, ids);
    Mat out2 = Zeros(tokens, heads * hd), lse2 = Zeros(tokens, heads);
    backend_->SparseAttention(qm.view, km.view, heads, idx, width, scale,
                              sink_data, out2.view, lse2.view);
    ExpectSameBits(got_out, Download(out2));
    ExpectSameBits(got_lse, Download(lse2));
  }
}

TEST_P(AttentionTest, SelectCandidateBlocksOfTiedAndNonFiniteScores) {
  const int64_t cols = 1300;
  const std::vector<int64_t> visible = {1300, 1000, 0, 3000, 33, 1, 640};
  const auto rows = static_cast<int64_t>(visible.size());
  std::vector<float> scores = TiedScores(rows * cols, 23);
  // Blocks of row 1 that are only -inf and NaN (dropped), and one that is
  // -inf apart from one number.
  for (int64_t e = 0; e < 64; ++e) {
    scores[cols + e] = e % 2 == 0 ? -std::numeric_limits<float>::infinity()
                                  : std::numeric_limits<float>::quiet_NaN();
    scores[cols + 64 + e] = -std::numeric_limits<float>::infinity();
  }
  scores[cols + 100] = -1e30f;
  const Mat m = Upload(scores, rows, cols);
  for (const int block_size : {1, 32, 64}) {
    for (const int topk_blocks : {1, 8, 300}) {
      SCOPED_TRACE(block_size * 1000 + topk_blocks);
      std::vector<int32_t> want_blocks, want_counts;
      RefCandidateBlocks(scores, cols, 0.5f, visible, topk_blocks, block_size,
                         &want_blocks, &want_counts);
      std::vector<int32_t> got_blocks(rows * topk_blocks, 7), got_counts(rows);
      backend_->SelectCandidateBlocks(m.view, 0.5f, visible, topk_blocks,
                                      block_size, absl::MakeSpan(got_blocks),
                                      absl::MakeSpan(got_counts));
      EXPECT_EQ(got_counts, want_counts);
      EXPECT_EQ(got_blocks, want_blocks);
    }
  }
}

TEST_P(AttentionTest, PlaceColumnsWritesASpanOfColumns) {
  const std::vector<float> x = Random(int64_t{3} * 4);
  Mat xm = Upload(x, 3, 4),
      y = Upload(std::vector<float>(size_t{3} * 9, 7.0f), 3, 9);
  backend_->PlaceColumns(xm.view, y.view, 2);
  std::vector<double> want(size_t{3} * 9, 7.0);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) want[r * 9 + 2 + c] = x[r * 4 + c];
  }
  ExpectAllNear(Download(y), want, 0.0);
}

TEST_P(AttentionTest, GatherColumnsTakesListedColumnsInOrder) {
  const std::vector<float> x = Random(int64_t{3} * 5);
  Mat xm = Upload(x, 3, 5), y = Zeros(3, 6);
  // Repeated, out of order, the last column.
  const std::vector<int32_t> cols = {4, 0, 0, 2, 3, 1};
  backend_->GatherColumns(xm.view, cols, y.view);
  std::vector<double> want(size_t{3} * 6);
  for (int r = 0; r < 3; ++r) {
    for (int j = 0; j < 6; ++j) want[r * 6 + j] = x[r * 5 + cols[j]];
  }
  ExpectAllNear(Download(y), want, 0.0);
}

// DCP: each rank's softmax attention over the keys it keeps, weighed by
// WeighDcpParts and summed over the ranks (the reduce-scatter), is the
// softmax over every key; global_own is the log-sum-exp over every key. A
// (token, head) where one rank keeps no key (-inf, zero part) and one where
// no rank does (-inf throughout: zeros and -inf).
TEST_P(AttentionTest, WeighDcpPartsMergesTheRanksIntoTheFullSoftmax) {
  const int ranks = 3;
  const int64_t T = 2, H = 6, hd = 5, keys = 4;
  const int64_t hl = H / ranks;
  const double inf = std::numeric_limits<double>::infinity();
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  // score[t][h][q][k], value[t][h][q][k][c]: rank q's keys.
  std::vector<double> score(T * H * ranks * keys), value(score.size() * hd);
  for (double& v : score) v = u(rng_);
  for (double& v : value) v = u(rng_);
  auto kept = [&](int64_t t, int64_t h, int64_t q) {
    if (t == 0 && h == 1) return false;    // no rank keeps a key
    return !(t == 1 && h == 4 && q == 2);  // rank 2 keeps none here
  };
  std::vector<float> lses(ranks * T * H);
  std::vector<std::vector<float>> parts(ranks,
                                        std::vector<float>(T * H * hd, 0.0f));
  std::vector<double> full(T * H * hd, 0.0), full_lse(T * H, -inf);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      double z_all = 0;
      std::vector<double> o_all(hd, 0.0);
      for (int64_t q = 0; q < ranks; ++q) {
        const int64_t i = t * H + h;
        if (!kept(t, h, q)) {
          lses[q * T * H + i] = -std::numeric_limits<float>::infinity();
          continue;
        }
        double z = 0;
        std::vector<double> o(hd, 0.0);
        for (int64_t k = 0; k < keys; ++k) {
          const int64_t at = ((i * ranks) + q) * keys + k;
          const double e = std::exp(score[at]);
          z += e;
          for (int64_t c = 0; c < hd; ++c) o[c] += e * value[at * hd + c];
        }
        lses[q * T * H + i] = static_cast<float>(std::log(z));
        for (int64_t c = 0; c < hd; ++c) {
          parts[q][i * hd + c] = static_cast<float>(o[c] / z);
          o_all[c] += o[c];
        }
        z_all += z;
      }
      if (z_all > 0) {
        full_lse[t * H + h] = std::log(z_all);
        for (int64_t c = 0; c < hd; ++c) {
          full[(t * H + h) * hd + c] = o_all[c] / z_all;
        }
      }
    }
  }
  Mat lm = Upload(lses, ranks, T * H);
  // The reduce-scatter: owner q's rows of every rank's send, summed.
  std::vector<double> merged(T * H * hd, 0.0);
  for (int rank = 0; rank < ranks; ++rank) {
    SCOPED_TRACE(rank);
    Mat part = Upload(parts[rank], T, H * hd);
    Mat send = Upload(std::vector<float>(ranks * T * hl * hd, std::nanf("")),
                      ranks * T, hl * hd);
    Mat own = Upload(std::vector<float>(T * hl, std::nanf("")), T, hl);
    backend_->WeighDcpParts(lm.view, part.view, rank, H, send.view, own.view);
    const std::vector<float> sent = Download(send);
    for (int64_t q = 0; q < ranks; ++q) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < hl * hd; ++j) {
          const int64_t h = q * hl + j / hd;
          merged[(t * H + h) * hd + j % hd] += sent[(q * T + t) * hl * hd + j];
        }
      }
    }
    const std::vector<float> got_lse = Download(own);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < hl; ++j) {
        const double want = full_lse[t * H + rank * hl + j];
        if (std::isinf(want)) {
          EXPECT_EQ(got_lse[t * hl + j],
                    -std::numeric_limits<float>::infinity());
        } else {
          EXPECT_NEAR(got_lse[t * hl + j], want, 1e-5);
        }
      }
    }
  }
  ExpectAllNear(std::vector<float>(merged.begin(), merged.end()), full, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
