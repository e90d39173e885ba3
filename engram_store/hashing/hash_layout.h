#ifndef MNEME_ENGRAM_STORE_HASHING_HASH_LAYOUT_H_
#define MNEME_ENGRAM_STORE_HASHING_HASH_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/engram_config.h"

namespace mneme::engram {

// The hashing constants of one Engram layer: everything the row id of an
// n-gram depends on besides the token ids.
struct LayerHashLayout {
  // The model layer (an entry of engram_layer_ids).
  int layer_id = 0;
  // max_ngram_size odd multipliers; entry k multiplies the compressed id k
  // positions back.
  std::vector<int64_t> multipliers;
  // Per column c = (n - 2) * n_heads + j: the prime table size of the
  // column, and its first row in the layer's table (the sum of the primes of
  // the columns before it).
  std::vector<int64_t> primes;
  std::vector<int64_t> offsets;
  // Rows of the layer's table: the sum of `primes`.
  int64_t num_rows = 0;
};

// The hashing constants of all Engram layers of a model (ENGRAM.md, "Row id
// computation"), derived from its EngramConfig and validated against it.
// Immutable after Create(); thread-safe.
class HashLayout {
 public:
  // Derives multipliers, primes and offsets for config.layer_ids (in that
  // order). InvalidArgument naming the config key when a field is out of
  // range (empty or duplicate layer ids, a negative layer id, a
  // num_embeddings entry count different from the layer count,
  // max_ngram_size < 2, n_heads < 1, vocab_size or compressed_vocab_size
  // < 1, pad_token_id < 0), or naming the layer when a layer's
  // engram_num_embeddings differs from the sum of its primes.
  static absl::StatusOr<HashLayout> Create(
      const checkpoint::EngramConfig& config);

  int max_ngram_size() const { return max_ngram_size_; }
  int n_heads() const { return n_heads_; }
  // (max_ngram_size - 1) * n_heads: 24 for V4.1.
  int num_columns() const { return (max_ngram_size_ - 1) * n_heads_; }
  // The token whose compressed id pads history before a sequence's start.
  int64_t pad_token_id() const { return pad_token_id_; }

  // One entry per Engram layer, in config order.
  const std::vector<LayerHashLayout>& layers() const { return layers_; }
  // The index in layers() of a model layer; InvalidArgument when the layer
  // has no Engram module.
  absl::StatusOr<int> LayerIndex(int layer_id) const;

  // Column of hash head `head` (0-based) of n-gram order `order` (>= 2).
  int Column(int order, int head) const {
    return (order - 2) * n_heads_ + head;
  }
  // The n-gram order / hash head of column `column`.
  int OrderOfColumn(int column) const { return column / n_heads_ + 2; }
  int HeadOfColumn(int column) const { return column % n_heads_; }

 private:
  HashLayout() = default;

  int max_ngram_size_ = 0;
  int n_heads_ = 0;
  int64_t pad_token_id_ = 0;
  std::vector<LayerHashLayout> layers_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_HASH_LAYOUT_H_
