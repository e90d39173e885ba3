#include "text/bpe.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_json.h"

namespace mneme::text {
namespace {

// Hugging Face caches words shorter than this (bytes).
constexpr size_t kMaxCachedWordBytes = 256;

// An optional string field: "" when absent or null.
absl::StatusOr<std::string> OptionalString(const nlohmann::json& spec,
                                           const char* field) {
  const auto it = spec.find(field);
  if (it == spec.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model field \"", field, "\" is not a string: ", it->dump()));
  }
  return it->get<std::string>();
}

// Length of the UTF-8 character whose lead byte is `lead`.
size_t CharLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

struct Symbol {
  int64_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

struct Candidate {
  uint32_t rank;
  int32_t pos;
  int64_t new_id;
};

// The queue pops the lowest rank, then the leftmost position.
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(
    const nlohmann::json& model, const BpeOptions& options) {
  if (!model.is_object()) {
    return absl::InvalidArgumentError("\"model\" is not a JSON object");
  }
  if (const auto type = model.find("type"); type != model.end()) {
    if (!type->is_string() || type->get<std::string>() != "BPE") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported model type ", type->dump(), " (only BPE is supported)"));
    }
  }
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel(options));
  if (const auto dropout = model.find("dropout");
      dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model dropout ", dropout->dump(),
                     " is not supported (tokenization must be deterministic)"));
  }
  ASSIGN_OR_RETURN(bool byte_fallback,
                   BoolField(model, "byte_fallback", false, "model"));
  if (byte_fallback) {
    return absl::InvalidArgumentError("model byte_fallback is not supported");
  }
  absl::StatusOr<bool> fuse_unk = BoolField(model, "fuse_unk", false, "model");
  absl::StatusOr<bool> ignore_merges =
      BoolField(model, "ignore_merges", false, "model");
  absl::StatusOr<std::string> prefix =
      OptionalString(model, "continuing_subword_prefix");
  absl::StatusOr<std::string> suffix =
      OptionalString(model, "end_of_word_suffix");
  absl::StatusOr<std::string> unk = OptionalString(model, "unk_token");
  for (const absl::Status& status :
       {fuse_unk.status(), ignore_merges.status(), prefix.status(),
        suffix.status(), unk.status()}) {
    RETURN_IF_ERROR(status);
  }
  bpe->fuse_unk_ = *fuse_unk;
  bpe->ignore_merges_ = *ignore_merges;
  bpe->continuing_subword_prefix_ = *prefix;
  bpe->end_of_word_suffix_ = *suffix;

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return absl::InvalidArgumentError("model has no \"vocab\" object");
  }
  bpe->vocab_.reserve(vocab->size());
  bpe->vocab_r_.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    const std::optional<int64_t> id = JsonTokenId(id_json);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab token \"", token, "\" has id ",
                       JsonSnippet(id_json), ", not an integer in [0, 2^32)"));
    }
    bpe->vocab_.emplace(token, *id);
    if (const auto [it, inserted] = bpe->vocab_r_.emplace(*id, token);
        !inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab tokens \"", it->second, "\" and \"", token,
                       "\" share id ", *id));
    }
  }
  if (!unk->empty()) {
    const auto it = bpe->vocab_.find(*unk);
    if (it == bpe->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model unk_token \"", *unk, "\" is not in the vocab"));
    }
    bpe->unk_id_ = it->second;
  }

  const auto merges = model.find("merges");
  if (merges != model.end() && !merges->is_null()) {
    if (!merges->is_array()) {
      return absl::InvalidArgumentError("model \"merges\" is not an array");
    }
    bpe->merges_.reserve(merges->size());
    uint32_t rank = 0;
    for (size_t i = 0; i < merges->size(); ++i) {
      const nlohmann::json& merge = (*merges)[i];
      std::string left, right;
      if (merge.is_string()) {
        const std::string& line = merge.get_ref<const std::string&>();
        if (line.rfind("#version", 0) == 0) continue;
        const size_t space = line.find(' ');
        if (space == std::string::npos ||
            line.find(' ', space + 1) != std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.merges[", i, "] \"", line,
                           "\" is not two tokens separated by one space"));
        }
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 &&
                 merge[0].is_string() && merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("model.merges[", i,
                         "] is neither \"a b\" nor "
                         "[\"a\", \"b\"]: ",
                         JsonSnippet(merge)));
      }
      const auto a = bpe->vocab_.find(left);
      const auto b = bpe->vocab_.find(right);
      if (a == bpe->vocab_.end() || b == bpe->vocab_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.merges[", i, "] names token \"",
            a == bpe->vocab_.end() ? left : right, "\", not in the vocab"));
      }
      const size_t skip =
          std::min(bpe->continuing_subword_prefix_.size(), right.size());
      const std::string merged = left + right.substr(skip);
      const auto result = bpe->vocab_.find(merged);
      if (result == bpe->vocab_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.merges[", i, "] makes \"", merged, "\", not in the vocab"));
      }
      // A repeated pair takes its last rank, as Hugging Face's map does.
      bpe->merges_[PairKey(a->second, b->second)] = {rank, result->second};
      ++rank;
    }
  }
  return bpe;
}

std::vector<int64_t> BpeModel::MergeWord(absl::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // The unk token waiting to be pushed (fused with following unknowns).
  bool pending_unk = false;
  const auto push = [&symbols](int64_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  std::string scratch;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t length = std::min(
        CharLength(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const bool first = pos == 0;
    const bool last = pos + length == word.size();
    absl::string_view piece = word.substr(pos, length);
    if ((!first && !continuing_subword_prefix_.empty()) ||
        (last && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (!first) scratch.append(continuing_subword_prefix_);
      scratch.append(piece.data(), piece.size());
      if (last) scratch.append(end_of_word_suffix_);
      piece = scratch;
    }
    pos += length;
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk) {
        push(*unk_id_);
        pending_unk = false;
      }
      push(it->second);
    } else if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) push(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) push(*unk_id_);
  if (symbols.empty()) return {};
  symbols.back().next = -1;

  std::priority_queue<Candidate, std::vector<Candidate>, CandidateAfter> queue;
  const auto lookup = [this](int64_t a, int64_t b) -> const MergeResult* {
    const auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeResult* m = lookup(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip entries made stale by an earlier merge.
    const MergeResult* current = lookup(left.id, right.id);
    if (current == nullptr || current->id != top.new_id) continue;
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeResult* m = lookup(symbols[left.prev].id, left.id)) {
        queue.push({m->rank, left.prev, m->id});
      }
    }
    if (left.next >= 0) {
      if (const MergeResult* m = lookup(left.id, symbols[left.next].id)) {
        queue.push({m->rank, top.pos, m->id});
      }
    }
  }
  std::vector<int64_t> ids;
  for (const Symbol& s : symbols) {
    if (!s.removed) ids.push_back(s.id);
  }
  return ids;
}

void BpeModel::Tokenize(absl::string_view word,
                        std::vector<int64_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable =
      options_.cache_capacity > 0 && word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int64_t> merged = MergeWord(word);
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= options_.cache_capacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(merged));
  }
}

std::optional<int64_t> BpeModel::TokenToId(absl::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::optional<absl::string_view> BpeModel::IdToToken(int64_t id) const {
  const auto it = vocab_r_.find(id);
  if (it == vocab_r_.end()) return std::nullopt;
  return absl::string_view(it->second);
}

}  // namespace mneme::text
