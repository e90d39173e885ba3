#include "engram_store/hashing/tokenizer_vocab.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/byte_level.h"

namespace mneme::engram {
namespace {

// tokenizer.json files are a few MB; anything far larger is not one.
constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{1} << 30;
// Hugging Face token ids are u32.
constexpr int64_t kMaxTokenId = (int64_t{1} << 32) - 1;

// The decoder's type: "ByteLevel" alone or as the only member of a Sequence
// decodes byte-level; null means no decoder.
absl::StatusOr<bool> IsByteLevelDecoder(const nlohmann::json& root,
                                        absl::string_view source) {
  const auto it = root.find("decoder");
  if (it == root.end() || it->is_null()) return false;
  const nlohmann::json* decoder = &*it;
  if (decoder->is_object()) {
    const auto type = decoder->find("type");
    if (type != decoder->end() && type->is_string() &&
        type->get_ref<const std::string&>() == "Sequence") {
      const auto members = decoder->find("decoders");
      if (members != decoder->end() && members->is_array() &&
          members->size() == 1) {
        decoder = &(*members)[0];
      }
    }
  }
  if (decoder->is_object()) {
    const auto type = decoder->find("type");
    if (type != decoder->end() && type->is_string()) {
      const std::string& name = type->get_ref<const std::string&>();
      if (name == "ByteLevel") return true;
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unsupported decoder type \"", name,
                       "\" (only ByteLevel is supported)"));
    }
  }
  return absl::DataLossError(
      absl::StrCat(source, ": decoder has no type string"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerVocab>> TokenizerVocab::Create(
    const std::string& tokenizer_json_path) {
  ASSIGN_OR_RETURN(std::string text,
                   ReadSmallFile(tokenizer_json_path, kMaxTokenizerJsonBytes));
  return FromJson(text, tokenizer_json_path);
}

absl::StatusOr<std::unique_ptr<TokenizerVocab>> TokenizerVocab::FromJson(
    absl::string_view json_text, absl::string_view source_name) {
  const ParsedJson parsed = ParseJson(json_text);
  if (parsed.too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": nests arrays / objects deeper than the limit of ",
        kMaxJsonDepth));
  }
  const nlohmann::json& root = parsed.value;
  if (root.is_discarded() || !root.is_object()) {
    return absl::DataLossError(
        absl::StrCat(source_name, ": not a JSON object (malformed JSON)"));
  }
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) {
    return absl::DataLossError(
        absl::StrCat(source_name, ": missing \"model\" object"));
  }
  if (const auto type = model->find("type"); type != model->end()) {
    if (!type->is_string() || type->get_ref<const std::string&>() != "BPE") {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": unsupported model type ", type->dump(),
                       " (only byte-level BPE is supported)"));
    }
  }
  const auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) {
    return absl::DataLossError(
        absl::StrCat(source_name, ": missing \"model.vocab\" object"));
  }
  ASSIGN_OR_RETURN(bool byte_level, IsByteLevelDecoder(root, source_name));

  auto result = std::unique_ptr<TokenizerVocab>(new TokenizerVocab());
  result->decoder_ = byte_level ? Decoder::kByteLevel : Decoder::kNone;
  // Distinct token strings: the keys of Hugging Face's get_vocab(true).
  absl::flat_hash_set<std::string> strings;
  for (const auto& [token, id_json] : vocab->items()) {
    const std::optional<int64_t> id = mneme::JsonTokenId(id_json);
    if (!id.has_value()) {
      return absl::DataLossError(absl::StrCat(
          source_name, ": model.vocab token \"", token, "\" has id ",
          JsonSnippet(id_json), ", not an integer in [0, 2^32)"));
    }
    if (!result->tokens_.emplace(*id, token).second) {
      return absl::DataLossError(absl::StrCat(
          source_name, ": model.vocab tokens \"", result->tokens_[*id],
          "\" and \"", token, "\" share id ", *id));
    }
    strings.insert(token);
  }
  // Added tokens get their ids as Hugging Face assigns them on load (the
  // "id" written in the file is only checked there, with a warning): the id
  // of an earlier added token or of a vocab token with the same content,
  // else the next id after the vocabulary and the added tokens so far. They
  // take precedence over the model's token of the same id.
  const auto vocab_size = static_cast<int64_t>(vocab->size());
  absl::flat_hash_map<std::string, int64_t> added_ids;
  int64_t max_added_id = -1;
  if (const auto added = root.find("added_tokens"); added != root.end()) {
    if (!added->is_array() && !added->is_null()) {
      return absl::DataLossError(
          absl::StrCat(source_name, ": \"added_tokens\" is not an array"));
    }
    if (added->is_array()) {
      for (size_t i = 0; i < added->size(); ++i) {
        const nlohmann::json& entry = (*added)[i];
        const auto id_it = entry.is_object() ? entry.find("id") : entry.end();
        const auto content_it =
            entry.is_object() ? entry.find("content") : entry.end();
        std::optional<int64_t> file_id;
        if (entry.is_object() && id_it != entry.end()) {
          file_id = mneme::JsonTokenId(*id_it);
        }
        if (!file_id.has_value() || content_it == entry.end() ||
            !content_it->is_string()) {
          return absl::DataLossError(absl::StrCat(
              source_name, ": added_tokens[", i,
              "] needs an integer \"id\" in [0, 2^32) and a string "
              "\"content\""));
        }
        const std::string& content = content_it->get_ref<const std::string&>();
        if (content.empty()) continue;  // Hugging Face ignores these.
        int64_t id;
        if (const auto it = added_ids.find(content); it != added_ids.end()) {
          id = it->second;
        } else if (const auto in_vocab = vocab->find(content);
                   in_vocab != vocab->end()) {
          id = *mneme::JsonTokenId(*in_vocab);
        } else if (max_added_id < 0) {
          id = vocab_size;
        } else {
          id = max_added_id >= vocab_size || vocab_size == 0 ? max_added_id + 1
                                                             : vocab_size;
        }
        if (id > kMaxTokenId) {
          return absl::DataLossError(
              absl::StrCat(source_name, ": added_tokens[", i, "] gets id ", id,
                           ", beyond 2^32 - 1"));
        }
        added_ids[content] = id;
        max_added_id = std::max(max_added_id, id);
        result->tokens_[id] = content;
        strings.insert(content);
      }
    }
  }
  result->size_ = static_cast<int64_t>(strings.size());
  return result;
}

std::optional<absl::string_view> TokenizerVocab::TokenString(int64_t id) const {
  const auto it = tokens_.find(id);
  if (it == tokens_.end()) return std::nullopt;
  return absl::string_view(it->second);
}

std::string TokenizerVocab::Decode(int64_t id,
                                   CleanUpTokenizationSpaces clean_up) const {
  const std::optional<absl::string_view> token = TokenString(id);
  if (!token.has_value()) return "";
  std::string text = decoder_ == Decoder::kByteLevel
                         ? text::Utf8Lossy(text::ByteLevelTokenBytes(*token))
                         : std::string(*token);
  if (clean_up == CleanUpTokenizationSpaces::kYes) {
    // transformers' clean_up_tokenization: sequential str.replace calls.
    constexpr std::pair<absl::string_view, absl::string_view> kReplacements[] =
        {
            {" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
            {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
            {" 've", "'ve"}, {" 're", "'re"},
        };
    for (const auto& [from, to] : kReplacements) {
      absl::StrReplaceAll({{from, to}}, &text);
    }
  }
  return text;
}

}  // namespace mneme::engram
