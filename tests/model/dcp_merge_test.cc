// The DCP policy and the host arithmetic of the log-sum-exp merge: which
// rank keeps which compressed entry, and that merging per-rank partial
// softmax results gives the softmax over all keys.

#include "model/dcp_merge.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace mneme::model {
namespace {

TEST(DcpLayoutTest, EveryEntryHasExactlyOneOwnerAndCountsAgree) {
  for (int size : {1, 2, 3, 4}) {
    for (int interleave : {1, 2, 5}) {
      std::vector<int64_t> owned(size, 0);
      for (int64_t e = 0; e < 200; ++e) {
        int owners = 0;
        for (int r = 0; r < size; ++r) {
          const DcpLayout l{.rank = r, .size = size, .interleave = interleave};
          EXPECT_EQ(l.OwnedEntriesBefore(e), owned[r])
              << "size " << size << " interleave " << interleave << " rank "
              << r << " count " << e;
          if (l.OwnsEntry(e)) {
            ++owners;
            ++owned[r];
          }
        }
        EXPECT_EQ(owners, 1) << "entry " << e;
      }
    }
  }
}

TEST(DcpLayoutTest, InterleaveKeepsRunsOnOneRank) {
  const DcpLayout r0{.rank = 0, .size = 2, .interleave = 3};
  const DcpLayout r1{.rank = 1, .size = 2, .interleave = 3};
  for (int64_t e : {0, 1, 2, 6, 7, 8}) EXPECT_TRUE(r0.OwnsEntry(e)) << e;
  for (int64_t e : {3, 4, 5, 9, 10, 11}) EXPECT_TRUE(r1.OwnsEntry(e)) << e;
  EXPECT_FALSE(r0.enabled() && r0.size == 1);
  EXPECT_FALSE((DcpLayout{}).enabled());
}

TEST(GlobalLogSumExpTest, CombinesRanksAndKeepsMinusInfinityWhenNothingSeen) {
  const float inf = std::numeric_limits<float>::infinity();
  // Two ranks, three (token, head) slots.
  const std::vector<float> lses = {1.0f, -inf, 0.5f,   // rank 0
                                   2.0f, -inf, -inf};  // rank 1
  const std::vector<float> g = GlobalLogSumExp(lses, 2, 3);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_NEAR(g[0], std::log(std::exp(1.0) + std::exp(2.0)), 1e-6);
  EXPECT_EQ(g[1], -inf);
  EXPECT_FLOAT_EQ(g[2], 0.5f);
}

// Softmax attention of one query over keys split between two ranks equals
// the sum of each rank's partial output weighted by exp(lse_rank -
// lse_global), laid out by the rank owning each head.
TEST(WeightedPartsByOwnerTest, MergedPartialsEqualTheFullSoftmax) {
  const int ranks = 2;
  const int64_t T = 1, H = 2, hd = 2;
  // Scores and values of 4 keys per head: keys 0, 1 on rank 0; 2, 3 on 1.
  const double s[2][4] = {{0.1, 1.2, -0.3, 0.7}, {2.0, -1.0, 0.5, 0.0}};
  const double v[4][2] = {{1, 2}, {3, -1}, {0.5, 0.5}, {-2, 4}};
  std::vector<float> lses(ranks * T * H);
  std::vector<std::vector<float>> parts(ranks, std::vector<float>(T * H * hd));
  for (int q = 0; q < ranks; ++q) {
    for (int h = 0; h < H; ++h) {
      double z = 0, o[2] = {0, 0};
      for (int k = 2 * q; k < 2 * q + 2; ++k) {
        z += std::exp(s[h][k]);
        for (int d = 0; d < 2; ++d) o[d] += std::exp(s[h][k]) * v[k][d];
      }
      lses[q * H + h] = static_cast<float>(std::log(z));
      for (int d = 0; d < 2; ++d) parts[q][h * hd + d] = o[d] / z;
    }
  }
  const std::vector<float> global = GlobalLogSumExp(lses, ranks, T * H);
  // Sum of both ranks' sends: the merged output, [owner][token][head][hd].
  std::vector<double> merged(T * H * hd, 0.0);
  for (int q = 0; q < ranks; ++q) {
    const std::vector<float> send =
        WeightedPartsByOwner(parts[q], lses, global, ranks, q, T, H, hd);
    for (size_t i = 0; i < send.size(); ++i) merged[i] += send[i];
  }
  for (int h = 0; h < H; ++h) {
    double z = 0, o[2] = {0, 0};
    for (int k = 0; k < 4; ++k) {
      z += std::exp(s[h][k]);
      for (int d = 0; d < 2; ++d) o[d] += std::exp(s[h][k]) * v[k][d];
    }
    // Head h is owned by rank h (one head per rank), token 0.
    for (int d = 0; d < 2; ++d) {
      EXPECT_NEAR(merged[h * hd + d], o[d] / z, 1e-5) << "head " << h;
    }
  }
}

}  // namespace
}  // namespace mneme::model
