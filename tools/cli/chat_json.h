#ifndef MNEME_TOOLS_CLI_CHAT_JSON_H_
#define MNEME_TOOLS_CLI_CHAT_JSON_H_

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"
#include "proto/serving/v1/serving.pb.h"

namespace mneme::cli {

// The most bytes a chat file may hold.
inline constexpr size_t kMaxChatJsonBytes = size_t{16} << 20;

// A chat in the OpenAI API's request shape, as the Serving API's Chat:
// either a list of messages, or an object with
//   "messages": [{"role": "system"|"user"|"assistant"|"tool"|"developer"|
//                 "latest_reminder", "content": string | null | [{"type":
//                 "text", "text": ...}, ...] (parts joined with no
//                 separator), "reasoning_content" (assistant),
//                 "tool_calls" (assistant: [{"id", "type": "function",
//                 "function": {"name", "arguments": string | object}}]),
//                 "tool_call_id" (tool)}, ...],
//   "tools": [{"type": "function", "function": {...}}, ...] (each function
//            object kept in its key order),
//   "tool_choice": "none" | "auto" | "required" |
//                  {"type": "function", "function": {"name": ...}},
//   "reasoning_effort": string | integer, "thinking": bool,
//   "chat_template_kwargs": {"thinking" | "enable_thinking": bool,
//                            "reasoning_effort": string | integer}.
// Other keys are ignored. InvalidArgument naming the JSON path otherwise.
// The server checks the rest (known roles' rules, tool names, efforts).
absl::StatusOr<serving::v1::Chat> ChatFromOpenAiJson(std::string_view text);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_CHAT_JSON_H_
