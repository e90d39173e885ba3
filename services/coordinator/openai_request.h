#ifndef MNEME_SERVICES_COORDINATOR_OPENAI_REQUEST_H_
#define MNEME_SERVICES_COORDINATOR_OPENAI_REQUEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/chat_request.h"
#include "services/coordinator/generate_params.h"
#include "services/coordinator/request_validator.h"
#include "text/chat_output_parser.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mneme::coordinator {

// The OpenAI API's request side, as the HTTP front reads it: the body's
// fields, typed and checked, turned into the engine's GenerateParams (one per
// choice). Every error names the field the client sent. docs/HTTP_API.md
// lists the fields.

// Bounds of the OpenAI fields (the engine's own are request_validator.h's,
// the chat's chat_request.h's).
inline constexpr int kMaxChoicesPerPrompt = 16;   // n
inline constexpr int kMaxChoicesPerRequest = 64;  // prompts x n

// An HTTP status with an OpenAI error body.
struct HttpError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
};

// The HTTP status and OpenAI error type of a Status (INVALID_ARGUMENT 400,
// RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, NOT_FOUND 404, else 500).
HttpError HttpErrorFromStatus(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}}.
nlohmann::json HttpErrorBody(const HttpError& error);
// 400 "'<field>' <what>" naming the field.
HttpError BadField(const std::string& field, const std::string& what);

// One request of /v1/completions or /v1/chat/completions.
struct OpenAiRequest {
  bool chat = false;
  std::string model;
  bool stream = false;
  bool include_usage = false;
  // Choices per prompt. Default 1.
  int n = 1;
  // Log-probabilities of the generated tokens: -1 = none; else the number
  // of alternatives per token (completions: `logprobs`; chat: `logprobs`
  // true with `top_logprobs`).
  int logprobs = -1;
  // Completions: the prompt is returned before the generated text (with its
  // log-probabilities when `logprobs` is set).
  bool echo = false;
  // vLLM's `prompt_logprobs`: -1 = none, else alternatives per position.
  int prompt_logprobs = -1;
  // Sampling, max_new_tokens, stop_token_ids, ignore_eos of every choice.
  GenerateParams base;
  std::vector<std::string> stops;
  // How the client spelled max_new_tokens.
  std::string max_tokens_field = "max_tokens";
  // Whether max_tokens was 0 (completions with echo: the prompt only).
  bool prompt_only = false;
  // The prompts (completions: one or more; chat: the rendered one), and
  // the text of each that was given as text (echo returns it as it was).
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::optional<std::string>> prompt_texts;
  // Chat only.
  ChatRequest chat_request;
};

// Reads the fields both endpoints share. `chat` selects the endpoint.
std::optional<HttpError> ParseOpenAiCommon(const nlohmann::json& body,
                                           const std::string& model_name,
                                           bool chat, OpenAiRequest& request);

// Completions: `prompt` as a string, a list of strings, a list of token ids
// or a list of token-id lists. Text is tokenized with the tokenizer's BOS;
// token ids are taken as they are.
std::optional<HttpError> ParseCompletionPrompts(
    const nlohmann::json& body, const text::Tokenizer& tokenizer,
    OpenAiRequest& request);

// Chat: messages, tools, tool_choice, reasoning settings; renders the prompt
// with `tmpl`. `default_kwargs` are the server's chat-template kwargs
// (`--default-chat-template-kwargs`), which the request's own override.
// `raw_body` is the body's text (the tool schemas keep the client's key
// order, which the parsed `body` does not).
std::optional<HttpError> ParseChat(const nlohmann::json& body,
                                   const text::DeepSeekV4ChatTemplate& tmpl,
                                   const text::Tokenizer& tokenizer,
                                   const nlohmann::json& default_kwargs,
                                   const std::string& raw_body,
                                   OpenAiRequest& request);

// The server's default chat-template kwargs (`--default-chat-template-kwargs`):
// an object of `thinking` / `enable_thinking` (booleans) and
// `reasoning_effort` (a string or an integer). InvalidArgument naming the
// key otherwise.
absl::Status CheckDefaultChatTemplateKwargs(const nlohmann::json& kwargs);

// The engine requests of every choice, prompt-major: choice i is prompt
// i / n, sample i % n, each sample with its own seed (n greedy samples are
// equal, n sampled ones differ; the same seed gives the same n choices).
std::vector<GenerateParams> ChoiceParams(const OpenAiRequest& request);

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_OPENAI_REQUEST_H_
