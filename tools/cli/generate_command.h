#ifndef MNEME_TOOLS_CLI_GENERATE_COMMAND_H_
#define MNEME_TOOLS_CLI_GENERATE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme generate --server ADDR (--tokens T0,T1,... | --prompt TEXT |
//     --chat-json FILE) [--stop STRING] [--max-new-tokens N]
//     [--temperature X] [--top-p X] [--top-k N] [--min-p X] [--seed N]
//     [--stop-tokens S0,...] [--ignore-eos] [--request-id ID]
//     [--timeout-s S] [--json]
// Streams a generation from a coordinator (proto/serving/v1). Without
// --json prints each new token id on its own line as it arrives (with
// --prompt: the new text as it arrives), then
// `finish_reason: stop|length|abort|tool_calls`; with --json prints one
// object at the end, the same shape as `mneme run --json` (public
// contract):
//   {"token_ids": [...], "finish_reason": "...", "logprobs": [...],
//    "prompt_tokens": N, "request_id": "..."[, "text": "..."]}
// --chat-json FILE sends a chat (messages, tools, tool_choice, reasoning
// settings in the OpenAI request shape; chat_json.h) for the server's chat
// template. Without --json the answer's reasoning and content are printed
// as they arrive, after "[reasoning]" / "[content]" lines, then each tool
// call as "[tool_call ID] NAME ARGUMENTS"; with --json the object also has
// "text" (the content), "reasoning_content" and "tool_calls" ([{"id",
// "type": "function", "function": {"name", "arguments"}}]).
// Errors of the server (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE)
// are returned with their code and message.
absl::Status RunGenerate(const std::vector<std::string>& argv,
                         std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_GENERATE_COMMAND_H_
