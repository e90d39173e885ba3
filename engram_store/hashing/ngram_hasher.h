#ifndef MNEME_ENGRAM_STORE_HASHING_NGRAM_HASHER_H_
#define MNEME_ENGRAM_STORE_HASHING_NGRAM_HASHER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/engram_config.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/hash_layout.h"

namespace mneme::engram {

// Computes the Engram row ids of token sequences, bit-exact with the model's
// reference (ENGRAM.md, "Row id computation"). For Engram layer L, position t
// and column c = (n - 2) * n_heads + j (order n, head j):
//
//   h   = XOR over k = 0..n-1 of cid[t - k] * multipliers_L[k]   (int64 wrap)
//   row = (h mod primes_L[c], non-negative as Python's %) + offsets_L[c]
//
// where cid are compressed token ids and a position before the sequence's
// start holds the pad token's compressed id. Rows are ids into the layer's
// whole table (all 24 columns of V4.1), in [0, num_rows).
//
// Sequences may be hashed in chunks: a chunk's row ids depend only on its
// tokens and the max_ngram_size - 1 tokens before it, which the caller passes
// as `context`; a chunk hashed with its context gives the same row ids as the
// same positions of the whole sequence.
//
// Immutable after Create(); thread-safe. Owns its vocabulary.
class NgramHasher {
 public:
  // InvalidArgument for an invalid config (see HashLayout::Create), or when
  // the vocabulary's size differs from config.compressed_vocab_size (naming
  // both); OutOfRange when config.pad_token_id is not a token of the
  // vocabulary.
  static absl::StatusOr<std::unique_ptr<NgramHasher>> Create(
      const checkpoint::EngramConfig& config,
      std::unique_ptr<const CompressedVocabulary> vocabulary);

  const HashLayout& layout() const { return layout_; }
  const CompressedVocabulary& vocabulary() const { return *vocabulary_; }
  int num_columns() const { return layout_.num_columns(); }
  // Tokens of history a position's n-grams reach back: max_ngram_size - 1.
  int context_size() const { return layout_.max_ngram_size() - 1; }
  // The compressed id that stands for history before a sequence's start.
  int64_t pad_compressed_id() const { return pad_compressed_id_; }

  // Row ids of every column for every position of `tokens` for Engram layer
  // `layer_id`: row_ids[t * num_columns() + c], so row_ids.size() must be
  // tokens.size() * num_columns().
  // `context` holds the tokens that precede tokens[0] in the same sequence,
  // oldest first; only its last context_size() entries matter, and a shorter
  // context means the sequence starts at its first entry (empty: at
  // tokens[0]). InvalidArgument when the layer has no Engram module or
  // row_ids has the wrong size; OutOfRange naming the token id and its
  // position when a token (of `tokens` or the used part of `context`) is
  // outside the vocabulary.
  absl::Status ComputeRowIds(int layer_id, std::span<const int64_t> context,
                             std::span<const int64_t> tokens,
                             std::span<int64_t> row_ids) const;

  // As ComputeRowIds() for a subset of columns (each in [0, num_columns()),
  // any order, e.g. one tensor-parallel rank's): row_ids[t * columns.size()
  // + i] is the row of column columns[i]. InvalidArgument also for a column
  // out of range.
  absl::Status ComputeColumnRowIds(int layer_id,
                                   std::span<const int64_t> context,
                                   std::span<const int64_t> tokens,
                                   std::span<const int> columns,
                                   std::span<int64_t> row_ids) const;

  // ComputeRowIds() into a new vector of tokens.size() * num_columns() ids.
  absl::StatusOr<std::vector<int64_t>> RowIds(
      int layer_id, std::span<const int64_t> context,
      std::span<const int64_t> tokens) const;

 private:
  NgramHasher(HashLayout layout,
              std::unique_ptr<const CompressedVocabulary> vocabulary,
              int64_t pad_compressed_id);

  HashLayout layout_;
  std::unique_ptr<const CompressedVocabulary> vocabulary_;
  int64_t pad_compressed_id_;
  // 0 .. num_columns() - 1.
  std::vector<int> all_columns_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_HASHING_NGRAM_HASHER_H_
