#include "engram_store/hashing/ngram_hasher.h"

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "checkpoint/engram_config.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/primes.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

// 12 tokens onto 8 compressed ids; token 2 (the pad token) -> id 2.
const std::vector<int64_t> kLookup = {0, 1, 2, 3, 1, 4, 5, 0, 6, 7, 3, 7};

checkpoint::EngramConfig SmallConfig() {
  checkpoint::EngramConfig config;
  config.layer_ids = {1, 4};
  config.max_ngram_size = 4;
  config.n_heads = 2;
  config.vocab_size = 100;
  config.compressed_vocab_size = 8;
  config.pad_token_id = 2;
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes = SearchColumnPrimes(
      config.vocab_size, 2, config.max_ngram_size, config.n_heads);
  for (const auto& layer : *primes) {
    config.num_embeddings.push_back(
        std::accumulate(layer.begin(), layer.end(), int64_t{0}));
  }
  return config;
}

std::unique_ptr<const CompressedVocabulary> Vocabulary(
    std::vector<int64_t> lookup = kLookup) {
  return *CompressedVocabulary::FromLookupTable(std::move(lookup));
}

std::unique_ptr<NgramHasher> MakeHasher() {
  absl::StatusOr<std::unique_ptr<NgramHasher>> hasher =
      NgramHasher::Create(SmallConfig(), Vocabulary());
  EXPECT_TRUE(hasher.ok()) << hasher.status();
  return *std::move(hasher);
}

// The definition, position by position, with explicit padding.
int64_t ExpectedRow(const NgramHasher& hasher, int layer_index,
                    const std::vector<int64_t>& padded_cids, size_t now,
                    int column) {
  const LayerHashLayout& layer = hasher.layout().layers()[layer_index];
  const int order = hasher.layout().OrderOfColumn(column);
  uint64_t h = 0;
  for (int k = 0; k < order; ++k) {
    h ^= static_cast<uint64_t>(padded_cids[now - k]) *
         static_cast<uint64_t>(layer.multipliers[k]);
  }
  const int64_t signed_h = static_cast<int64_t>(h);
  const int64_t p = layer.primes[column];
  return ((signed_h % p) + p) % p + layer.offsets[column];
}

TEST(NgramHasherTest, ShapeAndRange) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  EXPECT_EQ(hasher->num_columns(), 6);
  EXPECT_EQ(hasher->context_size(), 3);
  EXPECT_EQ(hasher->pad_compressed_id(), 2);
  const std::vector<int64_t> tokens = {5, 6, 7, 8, 9, 10, 11, 0, 1};
  absl::StatusOr<std::vector<int64_t>> rows = hasher->RowIds(4, {}, tokens);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), tokens.size() * 6);
  const LayerHashLayout& layer = hasher->layout().layers()[1];
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int c = 0; c < 6; ++c) {
      const int64_t row = (*rows)[t * 6 + c];
      EXPECT_GE(row, layer.offsets[c]);
      EXPECT_LT(row, layer.offsets[c] + layer.primes[c]);
    }
  }
}

TEST(NgramHasherTest, SequenceStartIsPaddedWithThePadTokensId) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  const std::vector<int64_t> tokens = {9, 3, 11, 4, 6};
  std::vector<int64_t> padded = {2, 2, 2};  // pad token 2 -> compressed 2
  for (int64_t t : tokens) padded.push_back(kLookup[t]);
  for (int layer_index = 0; layer_index < 2; ++layer_index) {
    const int layer_id = hasher->layout().layers()[layer_index].layer_id;
    absl::StatusOr<std::vector<int64_t>> rows =
        hasher->RowIds(layer_id, {}, tokens);
    ASSERT_TRUE(rows.ok());
    for (size_t t = 0; t < tokens.size(); ++t) {
      for (int c = 0; c < 6; ++c) {
        EXPECT_EQ((*rows)[t * 6 + c],
                  ExpectedRow(*hasher, layer_index, padded, t + 3, c))
            << "layer " << layer_id << " t " << t << " c " << c;
      }
    }
  }
}

TEST(NgramHasherTest, PaddingEqualsAnExplicitPadTokenPrefix) {
  // Missing history reads as the pad token's compressed id: a sequence
  // preceded by three pad tokens hashes like the bare sequence.
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  const std::vector<int64_t> tokens = {7, 1, 10};
  const std::vector<int64_t> pads = {2, 2, 2};
  EXPECT_EQ(*hasher->RowIds(1, {}, tokens), *hasher->RowIds(1, pads, tokens));
}

TEST(NgramHasherTest, TokensSharingACompressedIdShareRows) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  // Tokens 1 and 4 both map to compressed id 1; 9 and 11 to 7.
  EXPECT_EQ(*hasher->RowIds(1, {}, std::vector<int64_t>{1, 9, 3}),
            *hasher->RowIds(1, {}, std::vector<int64_t>{4, 11, 10}));
}

TEST(NgramHasherTest, ChunksWithContextEqualTheWholeSequence) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  const std::vector<int64_t> seq = {3, 5, 7, 1, 0, 11, 2, 6, 9, 8, 4, 10, 5};
  const std::vector<int64_t> whole = *hasher->RowIds(4, {}, seq);
  for (size_t cut = 0; cut <= seq.size(); ++cut) {
    const std::span<const int64_t> all(seq);
    std::vector<int64_t> joined = *hasher->RowIds(4, {}, all.first(cut));
    // Whole prefix as context, and just the last three tokens.
    const std::vector<int64_t> tail =
        *hasher->RowIds(4, all.first(cut), all.subspan(cut));
    const size_t keep = std::min<size_t>(cut, 3);
    const std::vector<int64_t> tail_short =
        *hasher->RowIds(4, all.subspan(cut - keep, keep), all.subspan(cut));
    EXPECT_EQ(tail, tail_short);
    joined.insert(joined.end(), tail.begin(), tail.end());
    EXPECT_EQ(joined, whole) << "cut " << cut;
  }
}

TEST(NgramHasherTest, ColumnSubsetSelectsColumns) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  const std::vector<int64_t> seq = {3, 5, 7, 1};
  const std::vector<int64_t> all = *hasher->RowIds(1, {}, seq);
  const std::vector<int> columns = {5, 0, 3};
  std::vector<int64_t> some(seq.size() * columns.size());
  ASSERT_TRUE(hasher->ComputeColumnRowIds(1, {}, seq, columns, some).ok());
  for (size_t t = 0; t < seq.size(); ++t) {
    for (size_t i = 0; i < columns.size(); ++i) {
      EXPECT_EQ(some[t * 3 + i], all[t * 6 + columns[i]]);
    }
  }
}

TEST(NgramHasherTest, EmptyInputGivesNoRows) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  absl::StatusOr<std::vector<int64_t>> rows =
      hasher->RowIds(1, std::vector<int64_t>{1, 2}, {});
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->empty());
}

TEST(NgramHasherTest, OutOfRangeTokenIsNamed) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  absl::StatusOr<std::vector<int64_t>> rows =
      hasher->RowIds(1, {}, std::vector<int64_t>{1, 2, 12});
  ASSERT_EQ(rows.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(rows.status().message(), "token id 12"))
      << rows.status();
  EXPECT_TRUE(absl::StrContains(rows.status().message(), "position 2"))
      << rows.status();
  EXPECT_EQ(hasher->RowIds(1, {}, std::vector<int64_t>{-1}).status().code(),
            absl::StatusCode::kOutOfRange);
  // A context token that is used...
  EXPECT_EQ(hasher->RowIds(1, std::vector<int64_t>{99}, std::vector<int64_t>{1})
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  // ...but not one older than the n-grams reach.
  EXPECT_TRUE(hasher
                  ->RowIds(1, std::vector<int64_t>{99, 1, 1, 1},
                           std::vector<int64_t>{1})
                  .ok());
}

TEST(NgramHasherTest, BadRequestsAreInvalidArgument) {
  std::unique_ptr<NgramHasher> hasher = MakeHasher();
  const std::vector<int64_t> seq = {1, 2};
  EXPECT_EQ(hasher->RowIds(2, {}, seq).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int64_t> small(5);
  EXPECT_EQ(hasher->ComputeRowIds(1, {}, seq, small).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int> bad_columns = {6};
  std::vector<int64_t> out(2);
  EXPECT_EQ(hasher->ComputeColumnRowIds(1, {}, seq, bad_columns, out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NgramHasherTest, VocabularySizeMismatchNamesBothSizes) {
  checkpoint::EngramConfig config = SmallConfig();
  config.compressed_vocab_size = 9;
  absl::StatusOr<std::unique_ptr<NgramHasher>> hasher =
      NgramHasher::Create(config, Vocabulary());
  ASSERT_EQ(hasher.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(hasher.status().message(), "expects 9"))
      << hasher.status();
  EXPECT_TRUE(absl::StrContains(hasher.status().message(), "gives 8"))
      << hasher.status();
}

TEST(NgramHasherTest, PadTokenOutsideTheVocabularyIsOutOfRange) {
  checkpoint::EngramConfig config = SmallConfig();
  config.pad_token_id = 12;
  EXPECT_EQ(NgramHasher::Create(config, Vocabulary()).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(NgramHasherTest, InvalidConfigOrNoVocabularyIsInvalidArgument) {
  checkpoint::EngramConfig config = SmallConfig();
  config.num_embeddings[0] += 2;
  EXPECT_EQ(NgramHasher::Create(config, Vocabulary()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NgramHasher::Create(SmallConfig(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::engram
