#ifndef MNEME_TEXT_TOKENIZER_H_
#define MNEME_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "text/bpe.h"

namespace mneme::text {

class AddedVocabulary;
class Normalizer;
class PreTokenizer;

// Whether Encode() applies the file's post-processor (e.g. a
// TemplateProcessing that puts the BOS token first).
enum class AddSpecialTokens {
  kNo = 0,
  kYes = 1,
};

// Whether Decode() drops the added tokens marked special.
enum class SkipSpecialTokens {
  kNo = 0,
  kYes = 1,
};

struct TokenizerOptions {
  // A tokenizer_config.json to take bos_token / eos_token from (Create()
  // only). Default: "" = tokenizer_config.json in the tokenizer.json's
  // directory if there is one.
  std::string tokenizer_config_path;
  // The text of a tokenizer_config.json (FromJson() only). Default: "" (none).
  std::string tokenizer_config_json;
  // BPE word cache. Default: see BpeOptions.
  BpeOptions bpe;
};

// A Hugging Face tokenizer.json tokenizer that encodes and decodes exactly as
// the reference `tokenizers` library does, for byte-level BPE files such as
// DeepSeek's:
//  - added_tokens (special or not; single_word, lstrip, rstrip, normalized),
//    found before anything else, leftmost and longest first;
//  - normalizer: see Normalizer; pre_tokenizer: see PreTokenizer;
//  - model: BPE (see BpeModel);
//  - post_processor: TemplateProcessing (single sequence), ByteLevel (no
//    effect on ids), Sequence of these, or null;
//  - decoder: ByteLevel (alone or in a Sequence), an empty Sequence (token
//    strings concatenated) or null (token strings joined by spaces).
// The file's truncation and padding settings are ignored: callers apply their
// own limits. Immutable after creation; thread-safe.
class Tokenizer {
 public:
  // Reads a tokenizer.json (and a tokenizer_config.json, see
  // TokenizerOptions). NotFound / PermissionDenied if a file cannot be read;
  // InvalidArgument naming the file and the problem for any content that is
  // malformed (not JSON, missing or mistyped fields, merges naming unknown
  // tokens, regexes that do not compile) or unsupported (component types,
  // byte_fallback, dropout).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(
      const std::string& tokenizer_json_path,
      const TokenizerOptions& options = {});
  // As Create() for the text of a tokenizer.json; `source_name` names it in
  // errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view tokenizer_json, const TokenizerOptions& options = {},
      absl::string_view source_name = "tokenizer.json");

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text`. InvalidArgument if `text` is not well-formed UTF-8;
  // ResourceExhausted if a pre-tokenizer regex search outgrows ICU's
  // backtracking stack.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text,
                                              AddSpecialTokens add) const;

  // The text of `ids` (always well-formed UTF-8: bytes that do not form
  // characters become U+FFFD). Ids without a token are skipped, as Hugging
  // Face does.
  std::string Decode(absl::Span<const int64_t> ids,
                     SkipSpecialTokens skip) const;

  // Decoding piece by piece (see IncrementalDecoder): Decode(ids) is the
  // UTF-8 repair of the DecodedBytes() of the ids that have some, joined by
  // decode_separator(). nullopt for an id without a token or a skipped
  // special token. The bytes need not be well-formed UTF-8 (a byte-level
  // token may hold part of a character).
  std::optional<std::string> DecodedBytes(int64_t id,
                                          SkipSpecialTokens skip) const;
  absl::string_view decode_separator() const;

  // The id of a token string (added tokens first, then the model's
  // byte-level spelling, e.g. "Ġhello"); nullopt if there is none.
  std::optional<int64_t> TokenToId(absl::string_view token) const;
  // The token string of an id (for an added token with normalized: true, its
  // content normalized, as Hugging Face has it); nullopt if there is none.
  std::optional<absl::string_view> IdToToken(int64_t id) const;
  // True if `content` is one of the file's added_tokens (so that Encode()
  // maps it to its id wherever it appears in the text).
  bool IsAddedToken(absl::string_view content) const;
  // True if `id` is an added token marked special.
  bool IsSpecialToken(int64_t id) const;
  // The number of distinct token strings (model vocab and added tokens).
  int64_t vocab_size() const { return vocab_size_; }

  // The BOS / EOS tokens: tokenizer_config.json's bos_token / eos_token if
  // given, else the special token the post-processor puts first (BOS), else
  // an added special token with a well-known name
  // (<｜begin▁of▁sentence｜>, <s>, <|begin_of_text|>, <|startoftext|>;
  // <｜end▁of▁sentence｜>, </s>, <|end_of_text|>, <|endoftext|>).
  std::optional<int64_t> bos_id() const { return bos_id_; }
  std::optional<int64_t> eos_id() const { return eos_id_; }
  std::optional<absl::string_view> bos_token() const;
  std::optional<absl::string_view> eos_token() const;

 private:
  enum class DecoderKind { kJoinWithSpaces, kConcatenate, kByteLevel };
  // One element of the post-processor's single-sequence template.
  struct TemplatePiece {
    // The input sequence ("A"), or else the ids of a special token.
    bool is_sequence = false;
    std::vector<int64_t> ids;
  };

  Tokenizer();
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Build(
      absl::string_view tokenizer_json, absl::string_view config_json,
      const BpeOptions& bpe_options, absl::string_view source_name,
      absl::string_view config_name);
  static absl::StatusOr<std::vector<TemplatePiece>> ParsePostProcessor(
      const nlohmann::json& post);
  static absl::StatusOr<DecoderKind> ParseDecoder(
      const nlohmann::json& decoder);
  // bos_id_ / eos_id_ from the config, the template, or well-known names.
  absl::Status ResolveBosEos(absl::string_view config_json,
                             absl::string_view source_name);

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<AddedVocabulary> added_;
  // Empty: no template (the sequence alone).
  std::vector<TemplatePiece> template_;
  DecoderKind decoder_ = DecoderKind::kJoinWithSpaces;
  int64_t vocab_size_ = 0;
  std::optional<int64_t> bos_id_;
  std::optional<int64_t> eos_id_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_TOKENIZER_H_
