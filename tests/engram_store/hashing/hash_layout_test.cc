#include "engram_store/hashing/hash_layout.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "checkpoint/engram_config.h"
#include "gtest/gtest.h"

namespace mneme::engram {
namespace {

checkpoint::EngramConfig V41Config() {
  checkpoint::EngramConfig config;
  config.layer_ids = {1, 14};
  config.num_embeddings = {384006168, 384016682};
  config.max_ngram_size = 4;
  config.n_heads = 8;
  config.vocab_size = 16000000;
  config.compressed_vocab_size = 99092;
  config.pad_token_id = 2;
  return config;
}

TEST(HashLayoutTest, V41Constants) {
  absl::StatusOr<HashLayout> layout = HashLayout::Create(V41Config());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_columns(), 24);
  EXPECT_EQ(layout->max_ngram_size(), 4);
  EXPECT_EQ(layout->n_heads(), 8);
  EXPECT_EQ(layout->pad_token_id(), 2);
  ASSERT_EQ(layout->layers().size(), 2u);

  const LayerHashLayout& first = layout->layers()[0];
  EXPECT_EQ(first.layer_id, 1);
  EXPECT_EQ(first.multipliers,
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349,
                                  73987337458391}));
  ASSERT_EQ(first.primes.size(), 24u);
  EXPECT_EQ(first.primes[0], 16000057);
  EXPECT_EQ(first.primes[1], 16000079);
  EXPECT_EQ(first.primes[2], 16000081);
  EXPECT_EQ(first.offsets[0], 0);
  EXPECT_EQ(first.offsets[1], 16000057);
  EXPECT_EQ(first.offsets[2], 16000057 + 16000079);
  EXPECT_EQ(first.num_rows, 384006168);

  const LayerHashLayout& second = layout->layers()[1];
  EXPECT_EQ(second.layer_id, 14);
  EXPECT_EQ(second.multipliers,
            (std::vector<int64_t>{67716810739261, 51510806800915,
                                  30921347202721, 82619226485591}));
  EXPECT_EQ(second.primes[21], 16000877);
  EXPECT_EQ(second.primes[22], 16000879);
  EXPECT_EQ(second.primes[23], 16000889);
  EXPECT_EQ(second.offsets[23], 384016682 - 16000889);
  EXPECT_EQ(second.num_rows, 384016682);
  // Layer 14's primes continue after layer 1's.
  EXPECT_GT(second.primes[0], first.primes[23]);
}

TEST(HashLayoutTest, OffsetsAreCumulativeSums) {
  absl::StatusOr<HashLayout> layout = HashLayout::Create(V41Config());
  ASSERT_TRUE(layout.ok());
  for (const LayerHashLayout& layer : layout->layers()) {
    int64_t sum = 0;
    for (size_t c = 0; c < layer.primes.size(); ++c) {
      EXPECT_EQ(layer.offsets[c], sum);
      sum += layer.primes[c];
    }
    EXPECT_EQ(layer.num_rows, sum);
  }
}

TEST(HashLayoutTest, ColumnNumbering) {
  absl::StatusOr<HashLayout> layout = HashLayout::Create(V41Config());
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->Column(2, 0), 0);
  EXPECT_EQ(layout->Column(3, 0), 8);
  EXPECT_EQ(layout->Column(4, 7), 23);
  for (int c = 0; c < 24; ++c) {
    EXPECT_EQ(layout->Column(layout->OrderOfColumn(c), layout->HeadOfColumn(c)),
              c);
  }
}

TEST(HashLayoutTest, LayerIndex) {
  absl::StatusOr<HashLayout> layout = HashLayout::Create(V41Config());
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(*layout->LayerIndex(1), 0);
  EXPECT_EQ(*layout->LayerIndex(14), 1);
  EXPECT_EQ(layout->LayerIndex(2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HashLayoutTest, NumEmbeddingsMismatchNamesTheLayer) {
  checkpoint::EngramConfig config = V41Config();
  config.num_embeddings[1] += 1;
  absl::StatusOr<HashLayout> layout = HashLayout::Create(config);
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(layout.status().message());
  EXPECT_TRUE(absl::StrContains(message, "layer 14")) << message;
  EXPECT_TRUE(absl::StrContains(message, "384016683")) << message;
  EXPECT_TRUE(absl::StrContains(message, "384016682")) << message;
}

TEST(HashLayoutTest, InvalidConfigsNameTheKey) {
  struct Case {
    void (*mutate)(checkpoint::EngramConfig&);
    const char* key;
  };
  const Case cases[] = {
      {[](checkpoint::EngramConfig& c) { c.layer_ids.clear(); },
       "engram_layer_ids"},
      {[](checkpoint::EngramConfig& c) {
         c.layer_ids = {1, 1};
       },
       "engram_layer_ids"},
      {[](checkpoint::EngramConfig& c) {
         c.layer_ids = {-1, 14};
       },
       "engram_layer_ids"},
      {[](checkpoint::EngramConfig& c) { c.num_embeddings.pop_back(); },
       "engram_num_embeddings"},
      {[](checkpoint::EngramConfig& c) { c.max_ngram_size = 1; },
       "engram_max_ngram_size"},
      {[](checkpoint::EngramConfig& c) { c.n_heads = 0; }, "engram_n_heads"},
      {[](checkpoint::EngramConfig& c) { c.vocab_size = 0; },
       "engram_vocab_size"},
      {[](checkpoint::EngramConfig& c) { c.compressed_vocab_size = 0; },
       "engram_compressed_vocab_size"},
      {[](checkpoint::EngramConfig& c) { c.pad_token_id = -1; },
       "engram_pad_token_id"},
  };
  for (const Case& c : cases) {
    checkpoint::EngramConfig config = V41Config();
    c.mutate(config);
    absl::StatusOr<HashLayout> layout = HashLayout::Create(config);
    ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument)
        << c.key;
    EXPECT_TRUE(absl::StrContains(layout.status().message(), c.key))
        << layout.status();
  }
}

}  // namespace
}  // namespace mneme::engram
