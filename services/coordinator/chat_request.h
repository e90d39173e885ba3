#ifndef MNEME_SERVICES_COORDINATOR_CHAT_REQUEST_H_
#define MNEME_SERVICES_COORDINATOR_CHAT_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "text/chat_output_parser.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mneme::coordinator {

// A chat request as both fronts (the OpenAI HTTP API and the gRPC Serving
// API) hand it to the chat template, whatever their wire format: the
// messages, the tools, how tools may be called and the reasoning settings;
// and the shared steps from it to prompt ids and the output parser. Errors
// are InvalidFieldError (request_validator.h) naming the field as the
// caller spells it.

// Bounds of a chat request.
inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxMessages = 4096;

// How tool calls may be made (`tool_choice`).
enum class ToolChoice {
  kNone = 0,      // Tools are not offered; output is text.
  kAuto = 1,      // The model decides (the default with tools).
  kRequired = 2,  // A call is forced (see ChatRequest::forced_prefix).
  kNamed = 3,     // A call of `forced_tool` is forced.
};

struct ChatRequest {
  std::vector<text::ChatMessage> messages;
  text::ChatRenderOptions render;
  bool thinking = false;
  // The V4.1 format (its DSML tag names) rather than V4's.
  bool v41 = false;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string forced_tool;
  // Parameter types of each offered tool, for the output parser.
  std::map<std::string, std::map<std::string, std::string>> tool_types;
  // Text the answer starts with that the prompt already holds (a forced
  // tool call's opening): fed to the output parser before the model's.
  std::string forced_prefix;
};

// Adds one tool: `function` is its function object (name, description,
// parameters), rendered in its own key order. `field` names it in errors
// (a missing or empty name, parameters that are not an object, nesting
// deeper than kMaxJsonDepth (common/json.h), a name declared twice, more
// than kMaxTools tools).
absl::Status AddChatTool(const nlohmann::ordered_json& function,
                         const std::string& field, ChatRequest& chat);

// Sets how tools may be called. kAuto without tools is kNone; kRequired
// without tools and kNamed with a name that is not one of the tools are
// errors naming `choice_field` and `name_field`.
absl::Status SetToolChoice(ToolChoice choice, const std::string& name,
                           const std::string& choice_field,
                           const std::string& name_field, ChatRequest& chat);

// Sets the thinking mode and the effort (text::NormalizeReasoningEffort of
// `effort` for `format`, when `thinking`): effort "none" turns thinking
// off. An effort the format does not know is an error naming
// `effort_field`.
absl::Status SetReasoning(text::ChatFormat format, bool thinking,
                          const std::optional<std::string>& effort,
                          const std::string& effort_field, ChatRequest& chat);

// The prompt ids of the chat: with tool choice kNone the tools are
// dropped; a forced call (kRequired, kNamed) turns thinking off and puts
// the call's opening (forced_prefix) after the rendered prompt. Sets `v41`
// from the template's format. A conversation the template refuses is the
// template's error, as it is (the caller names the field); text the
// tokenizer refuses is an error naming `messages_field`.
absl::StatusOr<std::vector<int64_t>> RenderChatPrompt(
    const text::DeepSeekV4ChatTemplate& tmpl, const text::Tokenizer& tokenizer,
    const std::string& messages_field, ChatRequest& chat);

// The output parser's options for the chat's answers (call ids from
// `id_seed`).
text::ChatOutputParserOptions ChatParserOptions(const ChatRequest& chat,
                                                uint64_t id_seed);

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_CHAT_REQUEST_H_
