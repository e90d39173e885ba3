#include "engram_store/hashing/ngram_hasher.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::engram {
namespace {

// Python's h % m for m > 0: the remainder with the sign of m. (With the
// multiplier bound h is never negative for ids of the vocabulary; the
// reference's semantics are kept anyway.)
int64_t FloorMod(int64_t h, int64_t m) {
  const int64_t r = h % m;
  return r < 0 ? r + m : r;
}

}  // namespace

NgramHasher::NgramHasher(HashLayout layout,
                         std::unique_ptr<const CompressedVocabulary> vocabulary,
                         int64_t pad_compressed_id)
    : layout_(std::move(layout)),
      vocabulary_(std::move(vocabulary)),
      pad_compressed_id_(pad_compressed_id),
      all_columns_(layout_.num_columns()) {
  std::iota(all_columns_.begin(), all_columns_.end(), 0);
}

absl::StatusOr<std::unique_ptr<NgramHasher>> NgramHasher::Create(
    const checkpoint::EngramConfig& config,
    std::unique_ptr<const CompressedVocabulary> vocabulary) {
  if (vocabulary == nullptr) {
    return absl::InvalidArgumentError("NgramHasher needs a vocabulary");
  }
  ASSIGN_OR_RETURN(HashLayout layout, HashLayout::Create(config));
  if (absl::Status status = vocabulary->CheckSize(config.compressed_vocab_size);
      !status.ok()) {
    return status;
  }
  absl::StatusOr<int64_t> pad = vocabulary->Lookup(config.pad_token_id);
  if (!pad.ok()) {
    return absl::OutOfRangeError(
        absl::StrCat("engram_pad_token_id: ", pad.status().message()));
  }
  return std::unique_ptr<NgramHasher>(
      new NgramHasher(std::move(layout), std::move(vocabulary), *pad));
}

absl::Status NgramHasher::ComputeColumnRowIds(
    int layer_id, std::span<const int64_t> context,
    std::span<const int64_t> tokens, std::span<const int> columns,
    std::span<int64_t> row_ids) const {
  ASSIGN_OR_RETURN(int layer_index, layout_.LayerIndex(layer_id));
  const LayerHashLayout& layer = layout_.layers()[layer_index];
  for (int column : columns) {
    if (column < 0 || column >= num_columns()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column ", column, " is outside [0, ", num_columns(), ")"));
    }
  }
  if (row_ids.size() != tokens.size() * columns.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_ids has ", row_ids.size(), " entries, expected ",
                     tokens.size(), " tokens x ", columns.size(), " columns"));
  }

  // Compressed ids of the history (padded) followed by the tokens.
  const size_t history = static_cast<size_t>(context_size());
  const size_t used_context = std::min(context.size(), history);
  std::vector<int64_t> cids(history + tokens.size(), pad_compressed_id_);
  const size_t context_start = context.size() - used_context;
  for (size_t i = 0; i < used_context; ++i) {
    absl::StatusOr<int64_t> cid =
        vocabulary_->Lookup(context[context_start + i]);
    if (!cid.ok()) {
      return absl::OutOfRangeError(absl::StrCat("context position ",
                                                context_start + i, ": ",
                                                cid.status().message()));
    }
    cids[history - used_context + i] = *cid;
  }
  for (size_t t = 0; t < tokens.size(); ++t) {
    absl::StatusOr<int64_t> cid = vocabulary_->Lookup(tokens[t]);
    if (!cid.ok()) {
      return absl::OutOfRangeError(
          absl::StrCat("position ", t, ": ", cid.status().message()));
    }
    cids[history + t] = *cid;
  }

  // hashes[n] for order n at the current position; the products wrap as
  // int64 does in numpy, computed in uint64 where wrapping is defined.
  const int max_order = layout_.max_ngram_size();
  std::vector<int64_t> hashes(max_order + 1, 0);
  int64_t* out = row_ids.data();
  for (size_t t = 0; t < tokens.size(); ++t) {
    const size_t now = history + t;
    uint64_t mix = 0;
    for (int k = 0; k < max_order; ++k) {
      mix ^= static_cast<uint64_t>(cids[now - k]) *
             static_cast<uint64_t>(layer.multipliers[k]);
      hashes[k + 1] = static_cast<int64_t>(mix);
    }
    for (int column : columns) {
      const int order = layout_.OrderOfColumn(column);
      *out++ =
          FloorMod(hashes[order], layer.primes[column]) + layer.offsets[column];
    }
  }
  return absl::OkStatus();
}

absl::Status NgramHasher::ComputeRowIds(int layer_id,
                                        std::span<const int64_t> context,
                                        std::span<const int64_t> tokens,
                                        std::span<int64_t> row_ids) const {
  return ComputeColumnRowIds(layer_id, context, tokens, all_columns_, row_ids);
}

absl::StatusOr<std::vector<int64_t>> NgramHasher::RowIds(
    int layer_id, std::span<const int64_t> context,
    std::span<const int64_t> tokens) const {
  std::vector<int64_t> row_ids(tokens.size() * num_columns());
  if (absl::Status status = ComputeRowIds(layer_id, context, tokens, row_ids);
      !status.ok()) {
    return status;
  }
  return row_ids;
}

}  // namespace mneme::engram
