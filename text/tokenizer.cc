#include "text/tokenizer.h"

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/added_vocabulary.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/tokenizer_json.h"
#include "text/utf8.h"

namespace mneme::text {
namespace {

// tokenizer.json files are a few MB; anything far larger is not one.
constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxConfigJsonBytes = uint64_t{64} << 20;

constexpr absl::string_view kWellKnownBos[] = {
    "<｜begin▁of▁sentence｜>", "<s>", "<|begin_of_text|>", "<|startoftext|>"};
constexpr absl::string_view kWellKnownEos[] = {
    "<｜end▁of▁sentence｜>", "</s>", "<|end_of_text|>", "<|endoftext|>"};

absl::Status InFile(const absl::Status& status, absl::string_view source) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(source, ": ", status.message()));
}

// The JSON of a tokenizer file nesting deeper than any parse here allows.
absl::Status TooDeep() {
  return absl::InvalidArgumentError(absl::StrCat(
      "nests arrays / objects deeper than the limit of ", kMaxJsonDepth));
}

// root[name], or null; never copies.
const nlohmann::json& Field(const nlohmann::json& root, const char* name) {
  static const nlohmann::json* const kNull = new nlohmann::json(nullptr);
  const auto it = root.find(name);
  return it == root.end() ? *kNull : *it;
}

// A tokenizer_config.json token entry: a string, {"content": string}, or
// null / absent.
absl::StatusOr<std::optional<std::string>> ConfigToken(
    const nlohmann::json& config, const char* name) {
  const auto it = config.find(name);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return content->get<std::string>();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", name,
                   "\" is neither a string nor an object with a "
                   "string \"content\""));
}

}  // namespace

// The single-sequence template of the post-processor (empty: none).
absl::StatusOr<std::vector<Tokenizer::TemplatePiece>>
Tokenizer::ParsePostProcessor(const nlohmann::json& post) {
  std::vector<TemplatePiece> pieces;
  if (post.is_null()) return pieces;
  std::vector<const nlohmann::json*> processors;
  ASSIGN_OR_RETURN(std::string type, TypeOf(post, "post_processor"));
  if (type == "Sequence") {
    const auto list = post.find("processors");
    if (list == post.end() || !list->is_array()) {
      return absl::InvalidArgumentError(
          "post_processor Sequence needs a \"processors\" array");
    }
    for (const nlohmann::json& member : *list) processors.push_back(&member);
  } else {
    processors.push_back(&post);
  }
  bool have_template = false;
  for (const nlohmann::json* processor_ptr : processors) {
    const nlohmann::json& processor = *processor_ptr;
    ASSIGN_OR_RETURN(std::string member, TypeOf(processor, "post_processor"));
    if (member == "ByteLevel") continue;  // Only adjusts offsets.
    if (member != "TemplateProcessing") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unsupported post_processor type \"", member,
          "\" (supported: TemplateProcessing, ByteLevel, Sequence)"));
    }
    if (have_template) {
      return absl::InvalidArgumentError(
          "more than one TemplateProcessing post_processor");
    }
    have_template = true;
    const auto single = processor.find("single");
    const auto specials = processor.find("special_tokens");
    if (single == processor.end() || !single->is_array()) {
      return absl::InvalidArgumentError(
          "post_processor TemplateProcessing needs a \"single\" array");
    }
    for (const nlohmann::json& item : *single) {
      if (!item.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "post_processor TemplateProcessing: bad template item ",
            JsonSnippet(item)));
      }
      TemplatePiece piece;
      if (const auto sequence = item.find("Sequence"); sequence != item.end()) {
        const auto id = sequence->find("id");
        if (id == sequence->end() || *id != "A") {
          return absl::InvalidArgumentError(absl::StrCat(
              "post_processor TemplateProcessing: the single template names "
              "a sequence other than \"A\": ",
              JsonSnippet(item)));
        }
        piece.is_sequence = true;
        pieces.push_back(std::move(piece));
        continue;
      }
      const auto special = item.find("SpecialToken");
      const nlohmann::json* ids = nullptr;
      if (special != item.end() && special->is_object() &&
          specials != processor.end() && specials->is_object()) {
        const auto id = special->find("id");
        if (id != special->end() && id->is_string()) {
          const auto entry = specials->find(id->get<std::string>());
          if (entry != specials->end() && entry->is_object() &&
              entry->contains("ids") && (*entry)["ids"].is_array()) {
            ids = &(*entry)["ids"];
          }
        }
      }
      if (ids == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "post_processor TemplateProcessing: special token without an "
            "\"ids\" entry in special_tokens: ",
            JsonSnippet(item)));
      }
      for (const nlohmann::json& value : *ids) {
        if (!value.is_number_integer() || value.get<int64_t>() < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("post_processor TemplateProcessing: bad id ",
                           JsonSnippet(value)));
        }
        piece.ids.push_back(value.get<int64_t>());
      }
      pieces.push_back(std::move(piece));
    }
  }
  return pieces;
}

absl::StatusOr<Tokenizer::DecoderKind> Tokenizer::ParseDecoder(
    const nlohmann::json& decoder) {
  if (decoder.is_null()) return DecoderKind::kJoinWithSpaces;
  ASSIGN_OR_RETURN(std::string type, TypeOf(decoder, "decoder"));
  std::vector<const nlohmann::json*> members;
  if (type == "Sequence") {
    const auto list = decoder.find("decoders");
    if (list == decoder.end() || !list->is_array()) {
      return absl::InvalidArgumentError(
          "decoder Sequence needs a \"decoders\" array");
    }
    for (const nlohmann::json& member : *list) members.push_back(&member);
  } else {
    members.push_back(&decoder);
  }
  // A Sequence concatenates what its members leave of the token strings.
  DecoderKind kind = DecoderKind::kConcatenate;
  for (const nlohmann::json* member : members) {
    ASSIGN_OR_RETURN(std::string member_type, TypeOf(*member, "decoder"));
    if (member_type != "ByteLevel" || kind == DecoderKind::kByteLevel) {
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported decoder \"", member_type,
                       "\" (supported: ByteLevel, alone or once in a "
                       "Sequence)"));
    }
    kind = DecoderKind::kByteLevel;
  }
  return kind;
}

absl::Status Tokenizer::ResolveBosEos(absl::string_view config_json,
                                      absl::string_view source_name) {
  if (!config_json.empty()) {
    const ParsedJson parsed = ParseJson(config_json);
    if (parsed.too_deep) return TooDeep();
    const nlohmann::json& config = parsed.value;
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("not a JSON object (malformed JSON)");
    }
    for (const auto& [name, id] :
         {std::pair<const char*, std::optional<int64_t>*>{"bos_token",
                                                          &bos_id_},
          {"eos_token", &eos_id_}}) {
      ASSIGN_OR_RETURN(std::optional<std::string> token,
                       ConfigToken(config, name));
      if (!token.has_value()) continue;
      *id = TokenToId(*token);
      if (!id->has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " \"", *token, "\" is not a token of ", source_name));
      }
    }
  }
  // The special token the template puts first is the BOS.
  if (!bos_id_.has_value() && !template_.empty() && !template_[0].is_sequence &&
      template_[0].ids.size() == 1) {
    bos_id_ = template_[0].ids[0];
  }
  const auto well_known =
      [&](absl::Span<const absl::string_view> names) -> std::optional<int64_t> {
    for (absl::string_view name : names) {
      const AddedToken* token = added_->FindByContent(name);
      if (token != nullptr && token->special) return token->id;
    }
    return std::nullopt;
  };
  if (!bos_id_.has_value()) bos_id_ = well_known(kWellKnownBos);
  if (!eos_id_.has_value()) eos_id_ = well_known(kWellKnownEos);
  return absl::OkStatus();
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(
    const std::string& tokenizer_json_path, const TokenizerOptions& options) {
  ASSIGN_OR_RETURN(
      std::string text,
      mneme::ReadSmallFile(tokenizer_json_path, kMaxTokenizerJsonBytes));
  std::string config_path = options.tokenizer_config_path;
  if (config_path.empty()) {
    const size_t slash = tokenizer_json_path.rfind('/');
    const std::string beside = slash == std::string::npos
                                   ? std::string("tokenizer_config.json")
                                   : tokenizer_json_path.substr(0, slash + 1) +
                                         "tokenizer_config.json";
    struct stat info;
    if (stat(beside.c_str(), &info) == 0) config_path = beside;
  }
  std::string config;
  if (!config_path.empty()) {
    ASSIGN_OR_RETURN(std::string read,
                     mneme::ReadSmallFile(config_path, kMaxConfigJsonBytes));
    config = std::move(read);
  }
  return Build(text, config, options.bpe, tokenizer_json_path, config_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view tokenizer_json, const TokenizerOptions& options,
    absl::string_view source_name) {
  return Build(tokenizer_json, options.tokenizer_config_json, options.bpe,
               source_name, "tokenizer_config.json");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Build(
    absl::string_view tokenizer_json, absl::string_view config_json,
    const BpeOptions& bpe_options, absl::string_view source_name,
    absl::string_view config_name) {
  const ParsedJson parsed = ParseJson(tokenizer_json);
  if (parsed.too_deep) return InFile(TooDeep(), source_name);
  const nlohmann::json& root = parsed.value;
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": not a JSON object (malformed JSON)"));
  }
  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());

  absl::StatusOr<std::unique_ptr<Normalizer>> normalizer =
      Normalizer::FromJson(Field(root, "normalizer"));
  if (!normalizer.ok()) return InFile(normalizer.status(), source_name);
  tokenizer->normalizer_ = *std::move(normalizer);

  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer =
      PreTokenizer::FromJson(Field(root, "pre_tokenizer"));
  if (!pre_tokenizer.ok()) return InFile(pre_tokenizer.status(), source_name);
  tokenizer->pre_tokenizer_ = *std::move(pre_tokenizer);

  const auto model = root.find("model");
  if (model == root.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": no \"model\""));
  }
  absl::StatusOr<std::unique_ptr<BpeModel>> bpe =
      BpeModel::FromJson(*model, bpe_options);
  if (!bpe.ok()) return InFile(bpe.status(), source_name);
  tokenizer->model_ = *std::move(bpe);

  absl::StatusOr<std::unique_ptr<AddedVocabulary>> added =
      AddedVocabulary::FromJson(Field(root, "added_tokens"), *tokenizer->model_,
                                *tokenizer->normalizer_);
  if (!added.ok()) return InFile(added.status(), source_name);
  tokenizer->added_ = *std::move(added);

  // len(tokenizer): distinct strings of the model vocab and added tokens.
  tokenizer->vocab_size_ = tokenizer->model_->vocab_size();
  for (const auto& token : tokenizer->added_->tokens()) {
    if (!tokenizer->model_->TokenToId(token->content).has_value()) {
      ++tokenizer->vocab_size_;
    }
  }

  absl::StatusOr<std::vector<TemplatePiece>> pieces =
      ParsePostProcessor(Field(root, "post_processor"));
  if (!pieces.ok()) return InFile(pieces.status(), source_name);
  tokenizer->template_ = *std::move(pieces);

  absl::StatusOr<DecoderKind> decoder = ParseDecoder(Field(root, "decoder"));
  if (!decoder.ok()) return InFile(decoder.status(), source_name);
  tokenizer->decoder_ = *decoder;

  if (absl::Status status = tokenizer->ResolveBosEos(config_json, source_name);
      !status.ok()) {
    return InFile(status, config_name);
  }
  return tokenizer;
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(
    absl::string_view text, AddSpecialTokens add) const {
  if (!IsWellFormedUtf8(text)) {
    return absl::InvalidArgumentError("text is not well-formed UTF-8");
  }
  std::vector<int64_t> ids;
  std::vector<std::string> pieces;
  for (const TextSplit& raw : added_->SplitRaw(text)) {
    if (raw.end <= raw.begin) continue;
    if (raw.token != nullptr) {
      ids.push_back(raw.token->id);
      continue;
    }
    ASSIGN_OR_RETURN(
        std::string normalized,
        normalizer_->Normalize(text.substr(raw.begin, raw.end - raw.begin)));
    const absl::string_view part = normalized;
    for (const TextSplit& split : added_->SplitNormalized(part)) {
      if (split.end <= split.begin) continue;
      if (split.token != nullptr) {
        ids.push_back(split.token->id);
        continue;
      }
      pieces.clear();
      if (absl::Status status = pre_tokenizer_->PreTokenize(
              part.substr(split.begin, split.end - split.begin), &pieces);
          !status.ok()) {
        return status;
      }
      for (const std::string& piece : pieces) model_->Tokenize(piece, &ids);
    }
  }
  if (add == AddSpecialTokens::kNo || template_.empty()) return ids;
  std::vector<int64_t> processed;
  processed.reserve(ids.size() + template_.size());
  for (const TemplatePiece& piece : template_) {
    if (piece.is_sequence) {
      processed.insert(processed.end(), ids.begin(), ids.end());
    } else {
      processed.insert(processed.end(), piece.ids.begin(), piece.ids.end());
    }
  }
  return processed;
}

std::optional<std::string> Tokenizer::DecodedBytes(
    int64_t id, SkipSpecialTokens skip) const {
  std::optional<absl::string_view> token;
  if (const AddedToken* added = added_->FindById(id)) {
    if (skip == SkipSpecialTokens::kYes && added->special) return std::nullopt;
    token = added->decoded_content;
  } else {
    token = model_->IdToToken(id);
    if (!token.has_value()) return std::nullopt;
    // Hugging Face decides "special" by the token's content.
    if (skip == SkipSpecialTokens::kYes) {
      const AddedToken* same = added_->FindByContent(*token);
      if (same != nullptr && same->special) return std::nullopt;
    }
  }
  if (decoder_ == DecoderKind::kByteLevel) {
    return text::ByteLevelTokenBytes(*token);
  }
  return std::string(*token);
}

absl::string_view Tokenizer::decode_separator() const {
  return decoder_ == DecoderKind::kJoinWithSpaces ? " " : "";
}

std::string Tokenizer::Decode(absl::Span<const int64_t> ids,
                              SkipSpecialTokens skip) const {
  std::string bytes;
  bool first = true;
  const absl::string_view separator = decode_separator();
  for (int64_t id : ids) {
    std::optional<std::string> piece = DecodedBytes(id, skip);
    if (!piece.has_value()) continue;
    if (!first) bytes.append(separator.data(), separator.size());
    first = false;
    bytes.append(*piece);
  }
  return text::Utf8Lossy(bytes);
}

std::optional<int64_t> Tokenizer::TokenToId(absl::string_view token) const {
  if (const AddedToken* added = added_->FindByContent(token)) {
    return added->id;
  }
  return model_->TokenToId(token);
}

std::optional<absl::string_view> Tokenizer::IdToToken(int64_t id) const {
  if (const AddedToken* added = added_->FindById(id)) {
    return absl::string_view(added->decoded_content);
  }
  return model_->IdToToken(id);
}

bool Tokenizer::IsAddedToken(absl::string_view content) const {
  return added_->FindByContent(content) != nullptr;
}

bool Tokenizer::IsSpecialToken(int64_t id) const {
  const AddedToken* added = added_->FindById(id);
  return added != nullptr && added->special;
}

std::optional<absl::string_view> Tokenizer::bos_token() const {
  return bos_id_.has_value() ? IdToToken(*bos_id_) : std::nullopt;
}

std::optional<absl::string_view> Tokenizer::eos_token() const {
  return eos_id_.has_value() ? IdToToken(*eos_id_) : std::nullopt;
}

}  // namespace mneme::text
