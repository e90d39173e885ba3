#ifndef MNEME_TEXT_BPE_H_
#define MNEME_TEXT_BPE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace mneme::text {

// Options of BpeModel that are not in the file.
struct BpeOptions {
  // Most words whose tokenization is cached (words of fewer than 256 bytes,
  // as Hugging Face); the cache is emptied when full. 0 disables it.
  // Default: 10000.
  size_t cache_capacity = 10000;
};

// The "model" of a Hugging Face tokenizer.json of type BPE: the vocabulary,
// the ranked merges, and Hugging Face's merge procedure (repeatedly merge the
// adjacent pair of lowest rank, leftmost first; O(n log n) in the word's
// length). Supports unk_token / fuse_unk, continuing_subword_prefix,
// end_of_word_suffix and ignore_merges; dropout and byte_fallback are
// rejected. Immutable after FromJson() apart from its internal cache;
// thread-safe.
class BpeModel {
 public:
  // `model` is the tokenizer.json's "model" value. InvalidArgument naming the
  // problem: a type other than BPE, a vocab that is not an object of token to
  // integer id in [0, 2^32), two tokens with one id, a merge that is not
  // "a b" nor ["a", "b"], a merge whose parts or result are not in the
  // vocab, an unk_token not in the vocab, dropout, byte_fallback.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(
      const nlohmann::json& model, const BpeOptions& options = {});

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-tokenized word. Characters without a token
  // become the unk token (fused if fuse_unk) or, without one, are dropped,
  // as Hugging Face does.
  void Tokenize(absl::string_view word, std::vector<int64_t>* ids) const;

  std::optional<int64_t> TokenToId(absl::string_view token) const;
  std::optional<absl::string_view> IdToToken(int64_t id) const;
  // The number of vocab entries.
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }

 private:
  struct MergeResult {
    uint32_t rank = 0;
    int64_t id = 0;
  };

  explicit BpeModel(const BpeOptions& options) : options_(options) {}
  static uint64_t PairKey(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
  }
  std::vector<int64_t> MergeWord(absl::string_view word) const;

  BpeOptions options_;
  absl::flat_hash_map<std::string, int64_t> vocab_;
  absl::flat_hash_map<int64_t, std::string> vocab_r_;
  absl::flat_hash_map<uint64_t, MergeResult> merges_;
  std::optional<int64_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int64_t>> cache_
      ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_BPE_H_
