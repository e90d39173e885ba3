// libFuzzer target for the request side of the OpenAI HTTP front: the input
// is a request body, read as services/coordinator/http_front.cc reads the
// body of /v1/completions and /v1/chat/completions. Every body is tried on
// both endpoints: ParseOpenAiCommon, then ParseCompletionPrompts or
// ParseChat (messages, tools, tool_choice, reasoning settings, the chat
// template's rendering and the tokenizer), then ChoiceParams and
// ValidateGenerateRequest against a served model, and for a chat the output
// parser's options. The input's length picks the chat format and the
// server's default chat-template kwargs. Each step must give a value or an
// error with an HTTP status and a message whose OpenAI error body
// serializes; anything else aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/chat_request.h"
#include "services/coordinator/generate_params.h"
#include "services/coordinator/openai_request.h"
#include "services/coordinator/request_validator.h"
#include "text/chat_output_parser.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace {

using ::mneme::coordinator::HttpError;
using ::mneme::coordinator::OpenAiRequest;
using ::mneme::text::ChatFormat;
using ::mneme::text::DeepSeekV4ChatTemplate;
using ::mneme::text::Tokenizer;
using ::nlohmann::json;

// The served model's name when the body names none (the seeds use it).
constexpr char kModelName[] = "deepseek-v4";
// The served model's context, as engine_->model_info() would report it.
constexpr int64_t kMaxContextTokens = 4096;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

const Tokenizer& SyntheticTokenizer() {
  static const Tokenizer* const tokenizer = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::FromJson(mneme::synthetic::SyntheticTokenizerJson());
    if (!t.ok()) Fail(t.status().ToString());
    return t->release();
  }();
  return *tokenizer;
}

const DeepSeekV4ChatTemplate& Template(ChatFormat format) {
  static const DeepSeekV4ChatTemplate* templates[3] = {};
  const int index = static_cast<int>(format);
  if (templates[index] == nullptr) {
    mneme::text::ChatTemplateOptions options;
    options.format = format;
    options.missing_special_tokens =
        mneme::text::MissingSpecialTokens::kRenderAsText;
    absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> t =
        DeepSeekV4ChatTemplate::Create(SyntheticTokenizer(), options);
    if (!t.ok()) Fail(t.status().ToString());
    templates[index] = t->release();
  }
  return *templates[index];
}

// The server's --default-chat-template-kwargs, one of a few valid ones.
const json& DefaultKwargs(size_t pick) {
  static const json* const kwargs = new json[3]{
      json::object(),
      json{{"thinking", true}},
      json{{"enable_thinking", true}, {"reasoning_effort", "high"}},
  };
  return kwargs[pick % 3];
}

// An error must say what is wrong in a body the front can send (the front
// serializes it with the strict UTF-8 handler).
void CheckError(const HttpError& e) {
  if (e.status < 400 || e.status > 599) {
    Fail("an error with HTTP status " + std::to_string(e.status));
  }
  if (e.message.empty()) Fail("an error without a message");
  (void)mneme::coordinator::HttpErrorBody(e).dump();
}

void CheckStatus(const absl::Status& status) {
  if (status.ok()) return;
  if (status.message().empty()) Fail("a refusal without a message");
  CheckError(mneme::coordinator::HttpErrorFromStatus(status));
}

void ParseOne(const json& body, const std::string& raw, bool chat,
              size_t pick) {
  const Tokenizer& tokenizer = SyntheticTokenizer();
  // The body's own model name, so that a mutated name still reaches the
  // fields after it.
  auto model = body.find("model");
  const std::string model_name = model != body.end() && model->is_string()
                                     ? model->get<std::string>()
                                     : kModelName;
  OpenAiRequest request;
  if (std::optional<HttpError> e = mneme::coordinator::ParseOpenAiCommon(
          body, model_name, chat, request)) {
    return CheckError(*e);
  }
  if (request.n < 1 || request.n > mneme::coordinator::kMaxChoicesPerPrompt) {
    Fail("n out of its bounds");
  }
  std::optional<HttpError> e;
  if (chat) {
    static constexpr ChatFormat kFormats[] = {
        ChatFormat::kV4_0731, ChatFormat::kV41, ChatFormat::kV4Preview};
    e = mneme::coordinator::ParseChat(body, Template(kFormats[pick % 3]),
                                      tokenizer, DefaultKwargs(pick / 3), raw,
                                      request);
  } else {
    e = mneme::coordinator::ParseCompletionPrompts(body, tokenizer, request);
  }
  if (e) return CheckError(*e);
  if (request.prompts.empty() ||
      request.prompts.size() != request.prompt_texts.size()) {
    Fail("a parsed request without its prompts");
  }
  const std::vector<mneme::coordinator::GenerateParams> params =
      mneme::coordinator::ChoiceParams(request);
  if (params.size() >
      static_cast<size_t>(mneme::coordinator::kMaxChoicesPerRequest)) {
    Fail("more choices than a request may have");
  }
  mneme::coordinator::ModelInfo info;
  info.vocab_size = mneme::synthetic::SyntheticVocabSize();
  info.eos_token_id = mneme::synthetic::kEosTokenId;
  info.max_context_tokens = kMaxContextTokens;
  mneme::coordinator::RequestFieldNames names;
  names.prompt = chat ? "messages" : "prompt";
  names.max_new_tokens = request.max_tokens_field;
  for (const mneme::coordinator::GenerateParams& p : params) {
    CheckStatus(mneme::coordinator::ValidateGenerateRequest(
        p, request.stops.size(), &info, names));
  }
  if (chat) {
    // The answer's parser, started on the forced call's opening as the
    // front starts it.
    mneme::text::ChatOutputParser parser(
        mneme::coordinator::ChatParserOptions(request.chat_request, 1));
    (void)parser.Feed(request.chat_request.forced_prefix);
    (void)parser.Feed("x</think>y");
    (void)parser.Finish();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const json body = json::parse(raw, nullptr, /*allow_exceptions=*/false);
  // The front answers 400 for these without looking further.
  if (body.is_discarded() || !body.is_object()) return 0;
  if (auto kwargs = body.find("chat_template_kwargs"); kwargs != body.end()) {
    CheckStatus(mneme::coordinator::CheckDefaultChatTemplateKwargs(*kwargs));
  }
  ParseOne(body, raw, /*chat=*/false, size);
  ParseOne(body, raw, /*chat=*/true, size);
  return 0;
}
