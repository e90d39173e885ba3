#ifndef MNEME_TEXT_CHAT_TEMPLATE_H_
#define MNEME_TEXT_CHAT_TEMPLATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "text/tokenizer.h"

namespace mneme::text {

enum class ChatRole {
  kSystem = 0,
  kUser = 1,
  kAssistant = 2,
  // A tool's result (OpenAI role "tool"); it answers one of the tool calls
  // of the assistant message before it.
  kTool = 3,
  // DeepSeek's search-agent instructions: rendered as a user turn.
  kDeveloper = 4,
  // DeepSeek's "latest reminder" (date, place, app, language).
  kLatestReminder = 5,
};

// One call of an assistant message (OpenAI `tool_calls[i]`).
struct ToolCall {
  // `id`: what tool messages name in tool_call_id. Default: "" (none).
  std::string id;
  // `function.name`; must not be empty.
  std::string name;
  // `function.arguments`: the text of a JSON object, as the client sent it
  // (its key order is kept in the prompt).
  std::string arguments;
};

// DeepSeek's internal "quick instruction" tasks (classifying a request
// instead of answering it); the OpenAI API has no such field.
enum class ChatTask {
  kNone = 0,
  kAction = 1,
  kQuery = 2,
  kAuthority = 3,
  kDomain = 4,
  kTitle = 5,
  kReadUrl = 6,
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  // The text; content given as a list of parts is joined by the caller.
  std::string content;
  // Assistant messages only: the reasoning that preceded `content` (the
  // OpenAI-style `reasoning_content`). Default: "" (none).
  std::string reasoning_content;
  // Assistant messages only: the calls the answer made. Default: none.
  std::vector<ToolCall> tool_calls;
  // Tool messages only: the id of the call this result answers. Default: ""
  // (the result stays where it is among the turn's results).
  std::string tool_call_id;
  // User and developer messages only. Default: kNone.
  ChatTask task = ChatTask::kNone;
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
  // Default: kDrop. Tools (tool_functions) force kKeep, as DeepSeek does.
  EarlierReasoning earlier_reasoning = EarlierReasoning::kDrop;
  // Default: kAdd.
  BosToken bos = BosToken::kAdd;
  // Default: kComplete.
  FinalAssistantMessage final_assistant = FinalAssistantMessage::kComplete;
  // The request's tools: each the JSON text of one tool's `function` object
  // (name, description, parameters) as the client sent it; printed in that
  // key order. Default: none.
  std::vector<std::string> tool_functions;
  // The JSON text of the request's response format (e.g. a JSON schema),
  // printed after the tools. Default: none.
  std::optional<std::string> response_format;
  // Which message declares the tools and the response format: a system or
  // developer message. Default: nullopt, DeepSeek's rule: V4 the first
  // message if it is a system or developer message, V4.1 the first system
  // message; without one an empty system message is put first.
  std::optional<size_t> tools_message_index;
  // The reasoning effort to render in thinking mode (chat mode ignores it),
  // as NormalizeReasoningEffort() returns it: V4 preview "", "high" or "max";
  // V4 0731 "", "low", "high" or "max"; V4.1 "", "low", "high", "max" or a
  // decimal budget 1..100. Default: "" (the format's default: no text on V4,
  // budget 75 on V4.1).
  std::string reasoning_effort;
};

// Revisions of DeepSeek's prompt format.
enum class ChatFormat {
  // DeepSeek-V4 as first released (April): effort "max" only.
  kV4Preview = 0,
  // The DeepSeek-V4 0731 checkpoints: effort low / high / max.
  kV4_0731 = 1,
  // DeepSeek-V4.1: <｜System｜> role token, numeric effort, DSML tags
  // " calls" / " invoke" / " parameter".
  kV41 = 2,
};

// The format of a checkpoint from its config.json text: model_type
// "deepseek_v41" (at the top or in text_config) is kV41; otherwise all four
// of dspark_block_size, dspark_markov_rank, dspark_noise_token_id and
// dspark_target_layer_ids make kV4_0731 and none of them kV4Preview.
// InvalidArgument for text that is not a JSON object, or only some of the
// four keys (a hand-edited config: the effort texts differ between the two
// V4 revisions, so it is not guessed).
absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view config_json);

// NormalizeReasoningEffort's answer: what to put in ChatRenderOptions.
struct EffortChoice {
  ThinkingMode thinking = ThinkingMode::kThinking;
  // For ChatRenderOptions::reasoning_effort: "" in chat mode; otherwise the
  // format's spelling ("low", "high", "max", or the V4.1 budget "1".."100").
  std::string reasoning_effort;
};

// The request's reasoning_effort (an integer budget given as its decimal
// text) turned into a thinking mode and the effort to render:
//   - nullopt: thinking, at the format's documented default, which is not
//     the maximum: V4 preview "high" (no text), V4 0731 "low" (no text),
//     V4.1 75;
//   - "none": chat mode, for every format;
//   - V4 preview: "high" (no text) or "max" ("Absolute maximum" text);
//   - V4 0731: "low" (no text), "high" ("Absolute maximum" text) or "max"
//     ("Beyond maximum" text);
//   - V4.1: "low" 50, "high" 75, "max" 100, or an integer 1..100.
// InvalidArgument naming the accepted values for anything else ("minimal",
// "medium", "xhigh", 0, 101, "5.0", ...).
absl::StatusOr<EffortChoice> NormalizeReasoningEffort(
    ChatFormat format, std::optional<std::string> effort);

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
  // Default: kError. With kError, the role tokens of optional features
  // (<｜latest_reminder｜>, the task tokens) are checked when a conversation
  // uses them: Render() fails if the tokenizer lacks them.
  MissingSpecialTokens missing_special_tokens = MissingSpecialTokens::kError;
  // Default: kV4_0731 (DetectChatFormat() tells a checkpoint's).
  ChatFormat format = ChatFormat::kV4_0731;
};

// The special-token strings the template writes.
struct ChatSpecialTokens {
  std::string bos;   // The tokenizer's BOS, e.g. <｜begin▁of▁sentence｜>.
  std::string eos;   // The tokenizer's EOS, e.g. <｜end▁of▁sentence｜>.
  std::string user;  // <｜User｜>
  std::string assistant;        // <｜Assistant｜>
  std::string think_begin;      // <think>
  std::string think_end;        // </think>
  std::string system;           // <｜System｜> (V4.1)
  std::string latest_reminder;  // <｜latest_reminder｜>
};

// The DeepSeek-V4 / V4.1 chat format, as DeepSeek's reference encoder
// (encoding_dsv4.py; V4.1 encoding.py) writes conversations:
//
//   BOS {effort}{system}{tools} <｜User｜>{user}
//   <｜Assistant｜></think>{answer} {DSML tool calls} EOS
//   <｜User｜><tool_result>...</tool_result> <｜Assistant｜><think> (thinking
//   mode)
//
// (without the spaces). In order:
//   - Tool messages become user turns of "<tool_result>{content}</tool_result>"
//     blocks joined by "\n\n", in the order of the calls of the assistant
//     message before them (by id); consecutive user messages merge into one
//     turn (joined by "\n\n"), unless the first has a task.
//   - The tools (TOOLS_TEMPLATE, one Python-style JSON schema per line) and
//     the response format follow "\n\n" after the content of the system or
//     developer message that declares them.
//   - Thinking mode without tools and with EarlierReasoning::kDrop: reasoning
//     of assistant turns before the last user turn is dropped, and so are
//     developer messages before it.
//   - System messages are their content alone (V4), or <｜System｜>{content}
//     (V4.1; a system message after the first counts as a user turn there).
//     Developer messages are <｜User｜>{content}, latest reminders
//     <｜latest_reminder｜>{content}.
//   - An assistant message is {reasoning</think> in thinking mode after the
//     last user turn (or always with kKeep / tools)}{content}{"\n\n" + the
//     DSML block of its tool calls}EOS, no EOS if it is continued.
//   - A user or developer turn followed by an assistant message, a latest
//     reminder or the end opens the answer: <｜Assistant｜> then <think> in
//     thinking mode for the last user turn (every one with kKeep / tools),
//     else </think>; a turn with a task writes the task's token instead.
//   - The reasoning effort (thinking mode only) opens the prompt after BOS:
//     V4 the effort text, V4.1 <｜System｜>Reasoning Effort: N (...)\n\n.
//
// Immutable after Create(); thread-safe. Borrows the tokenizer, which must
// outlive it.
class DeepSeekV4ChatTemplate {
 public:
  // The tokens come from the tokenizer: its BOS and EOS, and the added tokens
  // <｜User｜>, <｜Assistant｜>, <think>, </think> (and <｜System｜> for V4.1).
  // InvalidArgument naming the missing ones (unless options say to render
  // them as text).
  static absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> Create(
      const Tokenizer& tokenizer, const ChatTemplateOptions& options = {});

  // The prompt text. InvalidArgument (naming the message and field) for no
  // messages, reasoning_content / tool_calls on a message that is not from
  // the assistant, tool_call_id on one that is not a tool message, a task on
  // one that is not a user or developer message, an empty developer
  // message, a tool call without a name or whose arguments are not a JSON
  // object, a tool message that no assistant tool call precedes or whose
  // tool_call_id that assistant message did not issue, a tool function that
  // is not a JSON object, a response format that is not JSON, a
  // tools_message_index that is not a system or developer message, a
  // reasoning effort the format does not know, kContinue without a final
  // assistant message, or (kError) a role / task token the tokenizer lacks.
  // Sizes are the caller's to bound; JSON nesting deeper than
  // kMaxPythonJsonDepth is InvalidArgument.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     const ChatRenderOptions& options) const;

  // The prompt's ids: Render() encoded without the post-processor's special
  // tokens (the BOS is in the text). Errors as Render() and
  // Tokenizer::Encode().
  absl::StatusOr<std::vector<int64_t>> Encode(
      absl::Span<const ChatMessage> messages,
      const ChatRenderOptions& options) const;

  const ChatSpecialTokens& tokens() const { return tokens_; }
  ChatFormat format() const { return options_.format; }

 private:
  DeepSeekV4ChatTemplate(const Tokenizer& tokenizer, ChatSpecialTokens tokens,
                         ChatTemplateOptions options,
                         std::vector<std::string> absent_tokens)
      : tokenizer_(tokenizer),
        tokens_(std::move(tokens)),
        options_(options),
        absent_tokens_(std::move(absent_tokens)) {}

  // OK if `token` may be written: the tokenizer has it, or options render
  // missing tokens as text.
  absl::Status CheckOptionalToken(const std::string& token) const;

  const Tokenizer& tokenizer_;
  const ChatSpecialTokens tokens_;
  const ChatTemplateOptions options_;
  // The optional tokens (latest_reminder, tasks) the tokenizer lacks.
  const std::vector<std::string> absent_tokens_;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_CHAT_TEMPLATE_H_
