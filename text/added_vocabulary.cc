#include "text/added_vocabulary.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/bpe.h"
#include "text/normalizer.h"
#include "text/utf8.h"

namespace mneme::text {
namespace {

constexpr int64_t kMaxTokenId = (int64_t{1} << 32) - 1;

absl::StatusOr<bool> Flag(const nlohmann::json& entry, const char* name,
                          size_t index) {
  const auto it = entry.find(name);
  if (it == entry.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("added_tokens[", index, "] field \"", name,
                     "\" is not a boolean: ", it->dump()));
  }
  return it->get<bool>();
}

}  // namespace

void AddedVocabulary::Matcher::Add(absl::string_view pattern,
                                   const AddedToken* token) {
  if (pattern.empty()) return;
  uint32_t node = 0;
  for (unsigned char byte : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | byte;
    const auto it = edges.find(key);
    if (it != edges.end()) {
      node = it->second;
    } else {
      const auto child = static_cast<uint32_t>(terminal.size());
      terminal.push_back(nullptr);
      edges.emplace(key, child);
      node = child;
    }
  }
  terminal[node] = token;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::FromJson(
    const nlohmann::json& added_tokens, const BpeModel& model,
    const Normalizer& normalizer) {
  auto vocabulary = std::unique_ptr<AddedVocabulary>(new AddedVocabulary());
  if (added_tokens.is_null()) return vocabulary;
  if (!added_tokens.is_array()) {
    return absl::InvalidArgumentError("\"added_tokens\" is not an array");
  }
  const int64_t vocab_size = model.vocab_size();
  std::optional<int64_t> max_added_id;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const nlohmann::json& entry = added_tokens[i];
    const auto content =
        entry.is_object() ? entry.find("content") : entry.end();
    if (!entry.is_object() || content == entry.end() || !content->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("added_tokens[", i, "] needs a string \"content\""));
    }
    AddedToken token;
    token.content = content->get<std::string>();
    absl::StatusOr<bool> single_word = Flag(entry, "single_word", i);
    absl::StatusOr<bool> lstrip = Flag(entry, "lstrip", i);
    absl::StatusOr<bool> rstrip = Flag(entry, "rstrip", i);
    absl::StatusOr<bool> normalized = Flag(entry, "normalized", i);
    absl::StatusOr<bool> special = Flag(entry, "special", i);
    for (const absl::Status& status :
         {single_word.status(), lstrip.status(), rstrip.status(),
          normalized.status(), special.status()}) {
      RETURN_IF_ERROR(status);
    }
    token.single_word = *single_word;
    token.lstrip = *lstrip;
    token.rstrip = *rstrip;
    token.normalized = *normalized;
    token.special = *special;
    if (token.content.empty()) continue;  // Hugging Face ignores these.
    if (!IsWellFormedUtf8(token.content)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "added_tokens[", i, "] content is not well-formed UTF-8"));
    }

    if (const auto it = vocabulary->by_content_.find(token.content);
        it != vocabulary->by_content_.end()) {
      // The same content again: it keeps its id and takes the new flags;
      // once special, always special.
      AddedToken* existing = it->second;
      const bool was_special = existing->special;
      token.id = existing->id;
      *existing = token;
      existing->special = existing->special || was_special;
      continue;
    }
    if (const std::optional<int64_t> in_model =
            model.TokenToId(token.content)) {
      token.id = *in_model;
    } else if (!max_added_id.has_value()) {
      token.id = vocab_size;
    } else {
      token.id = *max_added_id >= vocab_size || vocab_size == 0
                     ? *max_added_id + 1
                     : vocab_size;
    }
    if (token.id > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat(
          "added_tokens[", i, "] gets id ", token.id, ", beyond 2^32 - 1"));
    }
    max_added_id = std::max(max_added_id.value_or(token.id), token.id);
    vocabulary->tokens_.push_back(std::make_unique<AddedToken>(token));
    AddedToken* stored = vocabulary->tokens_.back().get();
    vocabulary->by_content_.emplace(stored->content, stored);
    vocabulary->by_id_[stored->id] = stored;
  }
  for (const auto& token : vocabulary->tokens_) {
    token->decoded_content = token->content;
    if (!token->normalized) {
      vocabulary->raw_.Add(token->content, token.get());
      continue;
    }
    ASSIGN_OR_RETURN(std::string pattern, normalizer.Normalize(token->content));
    token->decoded_content = pattern;
    vocabulary->normalized_.Add(pattern, token.get());
  }
  return vocabulary;
}

const AddedToken* AddedVocabulary::FindById(int64_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

const AddedToken* AddedVocabulary::FindByContent(
    absl::string_view content) const {
  const auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : it->second;
}

std::vector<TextSplit> AddedVocabulary::Split(absl::string_view text,
                                              const Matcher& matcher) const {
  std::vector<TextSplit> splits;
  if (text.empty()) return splits;
  // Leftmost-longest, non-overlapping matches in the text as it is.
  std::vector<TextSplit> matches;
  if (matcher.terminal.size() > 1) {
    size_t pos = 0;
    while (pos < text.size()) {
      if (!matcher.first_byte[static_cast<unsigned char>(text[pos])]) {
        ++pos;
        continue;
      }
      uint32_t node = 0;
      size_t best_length = 0;
      const AddedToken* best = nullptr;
      for (size_t j = pos; j < text.size(); ++j) {
        const uint64_t key = (static_cast<uint64_t>(node) << 8) |
                             static_cast<unsigned char>(text[j]);
        const auto it = matcher.edges.find(key);
        if (it == matcher.edges.end()) break;
        node = it->second;
        if (matcher.terminal[node] != nullptr) {
          best = matcher.terminal[node];
          best_length = j + 1 - pos;
        }
      }
      if (best == nullptr) {
        ++pos;
        continue;
      }
      matches.push_back({pos, pos + best_length, best});
      pos += best_length;
    }
  }
  // Hugging Face's find_matches: single_word, lstrip and rstrip.
  size_t start_offset = 0;
  for (const TextSplit& match : matches) {
    size_t start = match.begin;
    size_t stop = match.end;
    const AddedToken& token = *match.token;
    if (token.single_word) {
      const bool space_before =
          start == 0 || !IsWordChar(LastChar(text.substr(0, start)));
      const bool space_after =
          stop == text.size() || !IsWordChar(FirstChar(text.substr(stop)));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) {
      const size_t new_start =
          start - TrailingWhitespaceBytes(text.substr(0, start));
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      stop += LeadingWhitespaceBytes(text.substr(stop));
    }
    if (start_offset < start) {
      splits.push_back({start_offset, start, nullptr});
    }
    splits.push_back({start, stop, match.token});
    start_offset = stop;
  }
  if (start_offset != text.size()) {
    splits.push_back({start_offset, text.size(), nullptr});
  }
  return splits;
}

}  // namespace mneme::text
