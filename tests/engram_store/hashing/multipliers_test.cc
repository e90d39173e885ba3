#include "engram_store/hashing/multipliers.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

constexpr int64_t kV41CompressedVocabSize = 99092;

TEST(MultipliersTest, PublishedLayerOneVector) {
  absl::StatusOr<std::vector<int64_t>> m =
      LayerMultipliers(1, kV41CompressedVocabSize, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, (std::vector<int64_t>{76632096046245, 4839876093313,
                                      35959672319349, 73987337458391}));
}

TEST(MultipliersTest, PublishedLayerFourteenVector) {
  absl::StatusOr<std::vector<int64_t>> m =
      LayerMultipliers(14, kV41CompressedVocabSize, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, (std::vector<int64_t>{67716810739261, 51510806800915,
                                      30921347202721, 82619226485591}));
}

TEST(MultipliersTest, FewerOrdersArePrefixesOfTheSameDraws) {
  absl::StatusOr<std::vector<int64_t>> four =
      LayerMultipliers(14, kV41CompressedVocabSize, 4);
  absl::StatusOr<std::vector<int64_t>> two =
      LayerMultipliers(14, kV41CompressedVocabSize, 2);
  ASSERT_TRUE(four.ok() && two.ok());
  EXPECT_EQ(*two, std::vector<int64_t>(four->begin(), four->begin() + 2));
}

TEST(MultipliersTest, OddAndBelowTheBound) {
  absl::StatusOr<int64_t> bound = MultiplierBound(kV41CompressedVocabSize);
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(
      *bound,
      (std::numeric_limits<int64_t>::max() / kV41CompressedVocabSize) / 2);
  for (int layer = 0; layer < 64; ++layer) {
    absl::StatusOr<std::vector<int64_t>> m =
        LayerMultipliers(layer, kV41CompressedVocabSize, 4);
    ASSERT_TRUE(m.ok());
    for (int64_t value : *m) {
      EXPECT_EQ(value % 2, 1);
      EXPECT_GT(value, 0);
      EXPECT_LT(value, 2 * *bound);
    }
  }
}

TEST(MultipliersTest, BoundIsAtLeastOne) {
  absl::StatusOr<int64_t> bound =
      MultiplierBound(std::numeric_limits<int64_t>::max());
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(*bound, 1);
  absl::StatusOr<std::vector<int64_t>> m =
      LayerMultipliers(3, std::numeric_limits<int64_t>::max(), 3);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, (std::vector<int64_t>{1, 1, 1}));
}

TEST(MultipliersTest, BadArgumentsAreInvalidArgument) {
  EXPECT_EQ(MultiplierBound(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerMultipliers(-1, 100, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerMultipliers(1, 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerMultipliers(1, 100, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::engram
