#include "text/chat_template.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

// DeepSeek's spellings, used when the tokenizer has no BOS / EOS and the
// template renders missing tokens as text.
constexpr char kDeepSeekBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kDeepSeekEos[] = "<｜end▁of▁sentence｜>";

}  // namespace

absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>>
DeepSeekV4ChatTemplate::Create(const Tokenizer& tokenizer,
                               const ChatTemplateOptions& options) {
  ChatSpecialTokens tokens;
  tokens.user = "<｜User｜>";
  tokens.assistant = "<｜Assistant｜>";
  tokens.think_begin = "<think>";
  tokens.think_end = "</think>";
  std::vector<std::string> missing;
  if (const std::optional<absl::string_view> bos = tokenizer.bos_token()) {
    tokens.bos = std::string(*bos);
  } else {
    tokens.bos = kDeepSeekBos;
    missing.emplace_back("a BOS token");
  }
  if (const std::optional<absl::string_view> eos = tokenizer.eos_token()) {
    tokens.eos = std::string(*eos);
  } else {
    tokens.eos = kDeepSeekEos;
    missing.emplace_back("an EOS token");
  }
  for (const std::string* token : {&tokens.user, &tokens.assistant,
                                   &tokens.think_begin, &tokens.think_end}) {
    if (!tokenizer.IsAddedToken(*token)) missing.push_back(*token);
  }
  if (!missing.empty() &&
      options.missing_special_tokens == MissingSpecialTokens::kError) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer lacks the DeepSeek-V4 chat template's special "
        "tokens: ",
        absl::StrJoin(missing, ", ")));
  }
  return std::unique_ptr<DeepSeekV4ChatTemplate>(
      new DeepSeekV4ChatTemplate(tokenizer, std::move(tokens)));
}

absl::StatusOr<std::string> DeepSeekV4ChatTemplate::Render(
    absl::Span<const ChatMessage> messages,
    const ChatRenderOptions& options) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError("a chat needs at least one message");
  }
  int64_t last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == ChatRole::kUser) last_user = static_cast<int64_t>(i);
    if (m.role != ChatRole::kAssistant && !m.reasoning_content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message ", i, ": only assistant messages have reasoning_content"));
    }
  }
  const bool continue_final =
      options.final_assistant == FinalAssistantMessage::kContinue;
  if (continue_final && messages.back().role != ChatRole::kAssistant) {
    return absl::InvalidArgumentError(
        "continuing the final assistant message needs the conversation to "
        "end with an assistant message");
  }
  const bool thinking = options.thinking == ThinkingMode::kThinking;
  const bool keep = options.earlier_reasoning == EarlierReasoning::kKeep;

  std::string prompt;
  if (options.bos == BosToken::kAdd) prompt = tokens_.bos;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const auto index = static_cast<int64_t>(i);
    const bool last = i + 1 == messages.size();
    switch (m.role) {
      case ChatRole::kSystem:
        prompt += m.content;
        break;
      case ChatRole::kUser:
        absl::StrAppend(&prompt, tokens_.user, m.content);
        // The assistant's turn opens after a user message that an answer
        // follows or that ends the conversation.
        if (last || messages[i + 1].role == ChatRole::kAssistant) {
          const bool think = thinking && (keep || index >= last_user);
          absl::StrAppend(&prompt, tokens_.assistant,
                          think ? tokens_.think_begin : tokens_.think_end);
        }
        break;
      case ChatRole::kAssistant:
        if (thinking && (keep || index > last_user)) {
          absl::StrAppend(&prompt, m.reasoning_content, tokens_.think_end);
        }
        prompt += m.content;
        if (!(last && continue_final)) prompt += tokens_.eos;
        break;
    }
  }
  return prompt;
}

absl::StatusOr<std::vector<int64_t>> DeepSeekV4ChatTemplate::Encode(
    absl::Span<const ChatMessage> messages,
    const ChatRenderOptions& options) const {
  ASSIGN_OR_RETURN(std::string prompt, Render(messages, options));
  return tokenizer_.Encode(prompt, AddSpecialTokens::kNo);
}

}  // namespace mneme::text
