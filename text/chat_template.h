#ifndef MNEME_TEXT_CHAT_TEMPLATE_H_
#define MNEME_TEXT_CHAT_TEMPLATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/tokenizer.h"

namespace mneme::text {

enum class ChatRole {
  kSystem = 0,
  kUser = 1,
  kAssistant = 2,
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  // Assistant messages only: the reasoning that preceded `content` (the
  // OpenAI-style `reasoning_content`). Default: "" (none).
  std::string reasoning_content;
};

// Whether the model thinks before it answers: thinking prompts end with
// "<think>", chat prompts with "</think>".
enum class ThinkingMode {
  kChat = 0,
  kThinking = 1,
};

// Thinking mode only: whether assistant turns before the last user message
// keep their reasoning in the prompt. DeepSeek drops it.
enum class EarlierReasoning {
  kDrop = 0,
  kKeep = 1,
};

// Whether the prompt starts with the BOS token.
enum class BosToken {
  kAdd = 0,
  kOmit = 1,
};

// What a final assistant message is: a finished turn (ends with EOS), or the
// start of the answer for the model to continue (prefill, no EOS).
enum class FinalAssistantMessage {
  kComplete = 0,
  kContinue = 1,
};

struct ChatRenderOptions {
  // Default: kChat.
  ThinkingMode thinking = ThinkingMode::kChat;
  // Default: kDrop.
  EarlierReasoning earlier_reasoning = EarlierReasoning::kDrop;
  // Default: kAdd.
  BosToken bos = BosToken::kAdd;
  // Default: kComplete.
  FinalAssistantMessage final_assistant = FinalAssistantMessage::kComplete;
};

// What Create() does when the tokenizer lacks one of the template's special
// tokens.
enum class MissingSpecialTokens {
  // InvalidArgument naming them.
  kError = 0,
  // Render DeepSeek's spellings as plain text (the model sees them as
  // ordinary text; for tests and tokenizers without chat tokens).
  kRenderAsText = 1,
};

struct ChatTemplateOptions {
  // Default: kError.
  MissingSpecialTokens missing_special_tokens = MissingSpecialTokens::kError;
};

// The special-token strings the template writes.
struct ChatSpecialTokens {
  std::string bos;   // The tokenizer's BOS, e.g. <｜begin▁of▁sentence｜>.
  std::string eos;   // The tokenizer's EOS, e.g. <｜end▁of▁sentence｜>.
  std::string user;  // <｜User｜>
  std::string assistant;    // <｜Assistant｜>
  std::string think_begin;  // <think>
  std::string think_end;    // </think>
};

// The DeepSeek-V4 chat format (as DeepSeek-V3.1 / V3.2 / V4 encode
// conversations), for system, user and assistant messages:
//
//   BOS {system} <｜User｜>{user} <｜Assistant｜></think>{answer} EOS
//   <｜User｜>{user} <｜Assistant｜></think>                (chat mode)
//   ... <｜User｜>{user} <｜Assistant｜><think>             (thinking mode)
//
// (without the spaces). A user message followed by an assistant message or
// ending the conversation is followed by <｜Assistant｜> and, in thinking
// mode for the last user message (or every one, with
// EarlierReasoning::kKeep), <think>; otherwise </think>. An assistant message
// after the last user message writes, in thinking mode, its reasoning and
// </think> before its content; earlier ones write their reasoning only with
// kKeep. Assistant messages end with EOS unless the last one is continued.
// System messages are their content alone, wherever they are. Tools, the
// developer / latest_reminder roles and reasoning effort prefixes are not
// supported.
//
// Immutable after Create(); thread-safe. Borrows the tokenizer, which must
// outlive it.
class DeepSeekV4ChatTemplate {
 public:
  // The tokens come from the tokenizer: its BOS and EOS, and the added tokens
  // <｜User｜>, <｜Assistant｜>, <think>, </think>. InvalidArgument naming the
  // missing ones (unless options say to render them as text).
  static absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> Create(
      const Tokenizer& tokenizer, const ChatTemplateOptions& options = {});

  // The prompt text. InvalidArgument for no messages, reasoning_content on a
  // message that is not from the assistant, or kContinue without a final
  // assistant message.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     const ChatRenderOptions& options) const;

  // The prompt's ids: Render() encoded without the post-processor's special
  // tokens (the BOS is in the text). Errors as Render() and
  // Tokenizer::Encode().
  absl::StatusOr<std::vector<int64_t>> Encode(
      absl::Span<const ChatMessage> messages,
      const ChatRenderOptions& options) const;

  const ChatSpecialTokens& tokens() const { return tokens_; }

 private:
  DeepSeekV4ChatTemplate(const Tokenizer& tokenizer, ChatSpecialTokens tokens)
      : tokenizer_(tokenizer), tokens_(std::move(tokens)) {}

  const Tokenizer& tokenizer_;
  const ChatSpecialTokens tokens_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_CHAT_TEMPLATE_H_
