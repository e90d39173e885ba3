#include "engram_store/hashing/primes.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

TEST(IsPrimeTest, MatchesASieveBelowTwoMillion) {
  constexpr int kLimit = 2'000'000;
  std::vector<bool> composite(kLimit, false);
  composite[0] = composite[1] = true;
  for (int i = 2; static_cast<int64_t>(i) * i < kLimit; ++i) {
    if (composite[i]) continue;
    for (int j = i * i; j < kLimit; j += i) composite[j] = true;
  }
  for (int n = 0; n < kLimit; ++n) {
    ASSERT_EQ(IsPrime(n), !composite[n]) << n;
  }
}

TEST(IsPrimeTest, LargeValues) {
  EXPECT_TRUE(IsPrime(18446744073709551557ull));  // Largest 64-bit prime.
  EXPECT_FALSE(IsPrime(18446744073709551615ull));
  EXPECT_TRUE(IsPrime(2305843009213693951ull));   // 2^61 - 1.
  EXPECT_FALSE(IsPrime(3825123056546413051ull));  // Strong pseudoprime, bases
                                                  // 2..23.
  EXPECT_FALSE(IsPrime(4294967297ull));           // 641 * 6700417.
  EXPECT_TRUE(IsPrime(16000057));
}

TEST(SearchColumnPrimesTest, V41PublishedFirstAndLastPrimes) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes =
      SearchColumnPrimes(16000000, 2, 4, 8);
  ASSERT_TRUE(primes.ok()) << primes.status();
  ASSERT_EQ(primes->size(), 2u);
  ASSERT_EQ((*primes)[0].size(), 24u);
  ASSERT_EQ((*primes)[1].size(), 24u);
  EXPECT_EQ((*primes)[0][0], 16000057);
  EXPECT_EQ((*primes)[0][1], 16000079);
  EXPECT_EQ((*primes)[0][2], 16000081);
  EXPECT_EQ((*primes)[1][21], 16000877);
  EXPECT_EQ((*primes)[1][22], 16000879);
  EXPECT_EQ((*primes)[1][23], 16000889);
}

TEST(SearchColumnPrimesTest, ConsecutiveDistinctPrimesAcrossLayers) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes =
      SearchColumnPrimes(16000000, 2, 4, 8);
  ASSERT_TRUE(primes.ok());
  std::vector<int64_t> all;
  for (const auto& layer : *primes)
    all.insert(all.end(), layer.begin(), layer.end());
  ASSERT_EQ(all.size(), 48u);
  int64_t expected = 16000000 - 1;
  for (int64_t p : all) {
    do {
      ++expected;
    } while (!IsPrime(expected));
    EXPECT_EQ(p, expected);
  }
}

TEST(SearchColumnPrimesTest, VocabSizeThatIsPrimeIsIncluded) {
  // The search starts strictly above vocab_size - 1.
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes =
      SearchColumnPrimes(1009, 1, 2, 3);
  ASSERT_TRUE(primes.ok());
  EXPECT_EQ((*primes)[0], (std::vector<int64_t>{1009, 1013, 1019}));
}

TEST(SearchColumnPrimesTest, SmallVocabSize) {
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes =
      SearchColumnPrimes(1, 2, 3, 2);
  ASSERT_TRUE(primes.ok());
  EXPECT_EQ((*primes)[0], (std::vector<int64_t>{2, 3, 5, 7}));
  EXPECT_EQ((*primes)[1], (std::vector<int64_t>{11, 13, 17, 19}));
}

TEST(SearchColumnPrimesTest, BadArgumentsAreInvalidArgument) {
  EXPECT_EQ(SearchColumnPrimes(0, 1, 4, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SearchColumnPrimes((int64_t{1} << 62) + 1, 1, 4, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SearchColumnPrimes(100, -1, 4, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SearchColumnPrimes(100, 1, 1, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SearchColumnPrimes(100, 1, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::engram
