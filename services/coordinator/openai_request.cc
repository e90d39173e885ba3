#include "services/coordinator/openai_request.h"

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/coordinator/request_validator.h"

namespace mneme::coordinator {

using nlohmann::json;

HttpError HttpErrorFromStatus(const absl::Status& status) {
  HttpError e;
  e.message = std::string(status.message());
  e.param = InvalidFieldName(status);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    default:
      e.status = 500;
      e.type = "internal_error";
  }
  return e;
}

json HttpErrorBody(const HttpError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.status}}}};
}

HttpError BadField(const std::string& field, const std::string& what) {
  HttpError e;
  e.message = absl::StrCat("'", field, "' ", what);
  e.param = field;
  return e;
}

namespace {

// Typed optional fields: nullopt when absent or null; an error when of the
// wrong type (or, where a range is given, out of it).
struct Fields {
  const json& body;
  std::optional<HttpError> error;

  const json* Get(const char* name) const {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<double> Number(const char* name) {
    const json* v = Get(name);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number()) {
      error = BadField(name, "must be a number");
      return std::nullopt;
    }
    return v->get<double>();
  }
  std::optional<int64_t> Int(const char* name, int64_t lo = INT64_MIN,
                             int64_t hi = INT64_MAX) {
    const json* v = Get(name);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number_integer()) {
      error = BadField(name, "must be an integer");
      return std::nullopt;
    }
    // Unsigned values above INT64_MAX are out of every range here.
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      error = BadField(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
      return std::nullopt;
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) {
      error = BadField(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
      return std::nullopt;
    }
    return i;
  }
  std::optional<bool> Bool(const char* name) {
    const json* v = Get(name);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_boolean()) {
      error = BadField(name, "must be true or false");
      return std::nullopt;
    }
    return v->get<bool>();
  }
};

// Fields OpenAI defines that change sampling in ways this server does not
// implement: accepted only at their neutral value.
std::optional<HttpError> RefuseUnsupported(Fields& f) {
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    const std::optional<double> v = f.Number(name);
    if (f.error) return f.error;
    if (v.has_value() && *v != 0) {
      return BadField(name, "is not supported (only 0)");
    }
  }
  if (const json* v = f.Get("repetition_penalty")) {
    if (!v->is_number() || v->get<double>() != 1.0) {
      return BadField("repetition_penalty", "is not supported (only 1)");
    }
  }
  if (const json* v = f.Get("logit_bias");
      v != nullptr && !(v->is_object() && v->empty())) {
    return BadField("logit_bias", "is not supported");
  }
  if (const json* v = f.Get("best_of")) {
    if (!v->is_number_integer() || v->get<int64_t>() != 1) {
      return BadField("best_of", "is not supported (only 1)");
    }
  }
  if (const json* v = f.Get("suffix")) {
    if (!v->is_string() || !v->get<std::string>().empty()) {
      return BadField("suffix", "is not supported");
    }
  }
  if (const json* v = f.Get("user"); v != nullptr && !v->is_string()) {
    return BadField("user", "must be a string");
  }
  return std::nullopt;
}

std::optional<HttpError> ParseLogprobs(Fields& f, bool chat,
                                       OpenAiRequest& request) {
  const json* lp = f.Get("logprobs");
  if (chat) {
    bool want = false;
    if (lp != nullptr) {
      if (!lp->is_boolean()) return BadField("logprobs", "must be a boolean");
      want = lp->get<bool>();
    }
    const std::optional<int64_t> top =
        f.Int("top_logprobs", 0, kMaxTopLogprobs);
    if (f.error) return f.error;
    if (top.has_value() && !want) {
      return BadField("top_logprobs", "needs 'logprobs': true");
    }
    if (want) request.logprobs = static_cast<int>(top.value_or(0));
  } else {
    const std::optional<int64_t> n = f.Int("logprobs", 0, kMaxTopLogprobs);
    if (f.error) return f.error;
    // OpenAI's completions: logprobs N returns the chosen token's
    // log-probability and the N most likely (0: the chosen only).
    if (n.has_value()) request.logprobs = static_cast<int>(*n);
    const std::optional<bool> echo = f.Bool("echo");
    if (f.error) return f.error;
    request.echo = echo.value_or(false);
  }
  const std::optional<int64_t> prompt_lp =
      f.Int("prompt_logprobs", -1, kMaxTopLogprobs);
  if (f.error) return f.error;
  request.prompt_logprobs = static_cast<int>(prompt_lp.value_or(-1));
  // vLLM: with echo and logprobs, the prompt's logprobs come with it.
  if (request.echo && request.logprobs >= 0 && request.prompt_logprobs < 0) {
    request.prompt_logprobs = request.logprobs;
  }
  return std::nullopt;
}

std::optional<HttpError> ParseStops(Fields& f, OpenAiRequest& request) {
  if (const json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      request.stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) {
        return BadField("stop", absl::StrCat("holds more than ",
                                             kMaxStopStrings, " strings"));
      }
      for (const json& s : *stop) {
        if (!s.is_string()) return BadField("stop", "must hold strings");
        request.stops.push_back(s.get<std::string>());
      }
    } else {
      return BadField("stop", "must be a string or a list of strings");
    }
    if (absl::Status st = ValidateStopStrings(request.stops, "stop");
        !st.ok()) {
      return HttpErrorFromStatus(st);
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return BadField("stop_token_ids", "must be a list");
    if (ids->size() > kMaxStopTokenIds) {
      return BadField("stop_token_ids",
                      absl::StrCat("holds more than ", kMaxStopTokenIds));
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer()) {
        return BadField("stop_token_ids", "must hold integers");
      }
      request.base.stop_token_ids.push_back(id.get<int64_t>());
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<HttpError> ParseOpenAiCommon(const json& body,
                                           const std::string& model_name,
                                           bool chat, OpenAiRequest& request) {
  request.chat = chat;
  Fields f{body, std::nullopt};
  const json* model = f.Get("model");
  if (model == nullptr || !model->is_string()) {
    return BadField("model", "is required (a string)");
  }
  if (model->get<std::string>() != model_name) {
    HttpError e = BadField(
        "model", absl::StrCat("'", model->get<std::string>(),
                              "' is not served here (this server serves '",
                              model_name, "')"));
    e.status = 404;
    e.type = "not_found_error";
    return e;
  }
  request.model = model_name;
  if (std::optional<HttpError> e = RefuseUnsupported(f)) return e;
  const std::optional<int64_t> n = f.Int("n", 1, kMaxChoicesPerPrompt);
  // Chat: max_completion_tokens (OpenAI's current name) wins over the
  // deprecated max_tokens.
  request.max_tokens_field = chat && f.Get("max_completion_tokens") != nullptr
                                 ? "max_completion_tokens"
                                 : "max_tokens";
  const std::optional<int64_t> max_tokens =
      f.Int(request.max_tokens_field.c_str(), 0, kMaxNewTokens);
  const std::optional<double> temperature = f.Number("temperature");
  const std::optional<double> top_p = f.Number("top_p");
  const std::optional<int64_t> top_k = f.Int("top_k");
  const std::optional<double> min_p = f.Number("min_p");
  const std::optional<int64_t> seed = f.Int("seed");
  const std::optional<bool> stream = f.Bool("stream");
  const std::optional<bool> ignore_eos = f.Bool("ignore_eos");
  if (f.error) return f.error;
  request.n = static_cast<int>(n.value_or(1));
  request.stream = stream.value_or(false);
  if (const json* so = f.Get("stream_options")) {
    if (!so->is_object()) {
      return BadField("stream_options", "must be an object");
    }
    auto it = so->find("include_usage");
    if (it != so->end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return BadField("stream_options.include_usage", "must be a boolean");
      }
      request.include_usage = it->get<bool>();
    }
  }
  if (std::optional<HttpError> e = ParseLogprobs(f, chat, request)) return e;
  GenerateParams& p = request.base;
  if (max_tokens.has_value() && *max_tokens == 0) {
    // vLLM: echo with max_tokens 0 returns the prompt alone; one token is
    // computed (its log-probabilities complete the prompt's) and dropped.
    if (chat || !request.echo) {
      return BadField(request.max_tokens_field,
                      "must be at least 1 (0 only with echo)");
    }
    request.prompt_only = true;
    p.max_new_tokens = 1;
  } else {
    p.max_new_tokens = max_tokens.value_or(kDefaultMaxNewTokens);
  }
  p.sampling.set_temperature(static_cast<float>(temperature.value_or(1.0)));
  p.sampling.set_top_p(static_cast<float>(top_p.value_or(1.0)));
  // -1 (as in vLLM) and 0 both mean no top-k; the validator bounds the rest.
  const int64_t k = top_k.value_or(0) == -1 ? 0 : top_k.value_or(0);
  p.sampling.set_top_k(static_cast<int32_t>(
      std::clamp<int64_t>(k, std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max())));
  p.sampling.set_min_p(static_cast<float>(min_p.value_or(0)));
  // No seed: a fresh one, so that repeated requests sample differently.
  uint64_t base_seed = 0;
  if (seed.has_value()) {
    base_seed = static_cast<uint64_t>(*seed);
  } else {
    thread_local std::mt19937_64 rng(std::random_device{}());
    base_seed = rng();
  }
  p.sampling.set_seed(base_seed);
  p.ignore_eos = ignore_eos.value_or(false);
  p.logprobs = true;
  p.top_logprobs = std::max(request.logprobs, 0);
  p.prompt_logprobs = request.prompt_logprobs;
  return ParseStops(f, request);
}

std::optional<HttpError> ParseCompletionPrompts(
    const json& body, const text::Tokenizer& tokenizer,
    OpenAiRequest& request) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return BadField("prompt", "is required");
  }
  const json& prompt = *it;
  auto encode = [&](const json& text,
                    const std::string& where) -> std::optional<HttpError> {
    absl::StatusOr<std::vector<int64_t>> ids =
        tokenizer.Encode(text.get<std::string>(), text::AddSpecialTokens::kYes);
    if (!ids.ok()) return BadField(where, std::string(ids.status().message()));
    request.prompts.push_back(*std::move(ids));
    request.prompt_texts.emplace_back(text.get<std::string>());
    return std::nullopt;
  };
  auto ids_of = [&](const json& list,
                    const std::string& where) -> std::optional<HttpError> {
    std::vector<int64_t> ids;
    ids.reserve(list.size());
    for (const json& id : list) {
      if (!id.is_number_integer()) {
        return BadField(where, "token ids must be integers");
      }
      ids.push_back(id.get<int64_t>());
    }
    request.prompts.push_back(std::move(ids));
    request.prompt_texts.emplace_back(std::nullopt);
    return std::nullopt;
  };
  if (prompt.is_string()) return encode(prompt, "prompt");
  if (!prompt.is_array()) {
    return BadField("prompt",
                    "must be a string, a list of strings, a list of token ids "
                    "or a list of token-id lists");
  }
  if (prompt.empty()) return BadField("prompt", "is empty");
  if (prompt[0].is_number_integer()) return ids_of(prompt, "prompt");
  const size_t max_prompts =
      static_cast<size_t>(kMaxChoicesPerRequest / request.n);
  if (prompt.size() > max_prompts) {
    return BadField("prompt",
                    absl::StrCat("holds ", prompt.size(), " prompts; at most ",
                                 max_prompts, " with n=", request.n));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string where = absl::StrCat("prompt[", i, "]");
    const json& p = prompt[i];
    std::optional<HttpError> e;
    if (p.is_string()) {
      e = encode(p, where);
    } else if (p.is_array()) {
      e = ids_of(p, where);
    } else {
      return BadField(where, "must be a string or a list of token ids");
    }
    if (e) return e;
  }
  return std::nullopt;
}

absl::Status CheckDefaultChatTemplateKwargs(const json& kwargs) {
  if (!kwargs.is_object()) {
    return absl::InvalidArgumentError(
        "default chat-template kwargs must be a JSON object");
  }
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
    const std::string& key = it.key();
    if (key == "thinking" || key == "enable_thinking") {
      if (!it->is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "default chat-template kwarg '", key, "' must be a boolean"));
      }
    } else if (key == "reasoning_effort") {
      if (!it->is_string() && !it->is_number_integer()) {
        return absl::InvalidArgumentError(
            "default chat-template kwarg 'reasoning_effort' must be a string "
            "or an integer");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown default chat-template kwarg '", key,
          "' (known: thinking, enable_thinking, reasoning_effort)"));
    }
  }
  return absl::OkStatus();
}

std::vector<GenerateParams> ChoiceParams(const OpenAiRequest& request) {
  std::vector<GenerateParams> out;
  out.reserve(request.prompts.size() * static_cast<size_t>(request.n));
  for (const std::vector<int64_t>& prompt : request.prompts) {
    for (int j = 0; j < request.n; ++j) {
      GenerateParams p = request.base;
      p.prompt = prompt;
      // Sample j's seeds are far from sample 0's (token i of a sample is
      // drawn with seed + i): an odd multiplier keeps them apart.
      p.sampling.set_seed(request.base.sampling.seed() +
                          static_cast<uint64_t>(j) * 0x9E3779B97F4A7C15ULL);
      out.push_back(std::move(p));
    }
  }
  return out;
}

namespace {

// The text of one message's `content`: a string, null, or a list of text
// parts (joined as the format's reference front joins them).
std::optional<HttpError> ContentText(const json& m, const std::string& where,
                                     const std::string& part_separator,
                                     std::string& out) {
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) return std::nullopt;
  if (content->is_string()) {
    out = content->get<std::string>();
    return std::nullopt;
  }
  if (!content->is_array()) {
    return BadField(where + ".content", "must be a string or a list of parts");
  }
  for (size_t i = 0; i < content->size(); ++i) {
    const json& part = (*content)[i];
    auto type = part.is_object() ? part.find("type") : part.end();
    auto text = part.is_object() ? part.find("text") : part.end();
    if (!part.is_object() || type == part.end() || *type != "text" ||
        text == part.end() || !text->is_string()) {
      return BadField(absl::StrCat(where, ".content[", i, "]"),
                      "must be {\"type\": \"text\", \"text\": ...} (only text "
                      "parts are supported)");
    }
    if (i > 0) out += part_separator;
    out += text->get<std::string>();
  }
  return std::nullopt;
}

std::optional<HttpError> ParseToolCalls(const json& m, const std::string& where,
                                        text::ChatMessage& msg) {
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return std::nullopt;
  if (!calls->is_array())
    return BadField(where + ".tool_calls", "must be a list");
  if (calls->size() > kMaxTools) {
    return BadField(where + ".tool_calls",
                    absl::StrCat("holds more than ", kMaxTools, " calls"));
  }
  for (size_t i = 0; i < calls->size(); ++i) {
    const json& c = (*calls)[i];
    const std::string at = absl::StrCat(where, ".tool_calls[", i, "]");
    if (!c.is_object()) return BadField(at, "must be an object");
    text::ToolCall call;
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
      if (!id->is_string()) return BadField(at + ".id", "must be a string");
      call.id = id->get<std::string>();
    }
    if (auto type = c.find("type");
        type != c.end() && !type->is_null() && *type != "function") {
      return BadField(at + ".type", "must be \"function\"");
    }
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) {
      return BadField(at + ".function", "is required (an object)");
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() ||
        name->get<std::string>().empty()) {
      return BadField(at + ".function.name", "is required (a string)");
    }
    call.name = name->get<std::string>();
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();
    } else {
      return BadField(at + ".function.arguments",
                      "must be a string holding a JSON object");
    }
    msg.tool_calls.push_back(std::move(call));
  }
  return std::nullopt;
}

std::optional<HttpError> ParseMessageList(const json& body, bool v41,
                                          std::vector<text::ChatMessage>& out) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return BadField("messages", "is required (a non-empty list)");
  }
  if (it->size() > kMaxMessages) {
    return BadField("messages", absl::StrCat("holds more than ", kMaxMessages,
                                             " messages"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return BadField(where, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return BadField(where + ".role", "is required (a string)");
    }
    text::ChatMessage msg;
    const std::string r = role->get<std::string>();
    if (r == "system") {
      msg.role = text::ChatRole::kSystem;
    } else if (r == "user") {
      msg.role = text::ChatRole::kUser;
    } else if (r == "assistant") {
      msg.role = text::ChatRole::kAssistant;
    } else if (r == "tool") {
      msg.role = text::ChatRole::kTool;
    } else if (r == "developer") {
      msg.role = text::ChatRole::kDeveloper;
    } else if (r == "latest_reminder") {
      msg.role = text::ChatRole::kLatestReminder;
    } else {
      return BadField(where + ".role",
                      absl::StrCat("'", r,
                                   "' is not system, user, assistant, tool, "
                                   "developer or latest_reminder"));
    }
    if (std::optional<HttpError> e =
            ContentText(m, where, v41 ? "\n\n" : "", msg.content)) {
      return e;
    }
    if (msg.role == text::ChatRole::kAssistant) {
      // DeepSeek's name, and vLLM's.
      for (const char* key : {"reasoning_content", "reasoning"}) {
        auto rc = m.find(key);
        if (rc == m.end() || rc->is_null()) continue;
        if (!rc->is_string()) {
          return BadField(absl::StrCat(where, ".", key), "must be a string");
        }
        msg.reasoning_content = rc->get<std::string>();
        break;
      }
      if (std::optional<HttpError> e = ParseToolCalls(m, where, msg)) return e;
    }
    if (msg.role == text::ChatRole::kTool) {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string()) {
        return BadField(where + ".tool_call_id", "is required (a string)");
      }
      msg.tool_call_id = id->get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

// tools and tool_choice. `ordered` is the body with its key order kept (the
// tool schemas are rendered in the client's order).
std::optional<HttpError> ParseTools(const nlohmann::ordered_json& ordered,
                                    ChatRequest& chat) {
  auto tools = ordered.find("tools");
  if (tools != ordered.end() && !tools->is_null()) {
    if (!tools->is_array()) return BadField("tools", "must be a list");
    if (tools->size() > kMaxTools) {
      return BadField("tools",
                      absl::StrCat("holds more than ", kMaxTools, " tools"));
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const auto& t = (*tools)[i];
      const std::string where = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return BadField(where, "must be an object");
      auto type = t.find("type");
      if (type == t.end() || *type != "function") {
        return BadField(where + ".type", "must be \"function\"");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) {
        return BadField(where + ".function", "is required (an object)");
      }
      if (absl::Status st = AddChatTool(*fn, where + ".function", chat);
          !st.ok()) {
        return HttpErrorFromStatus(st);
      }
    }
  }
  ToolChoice kind = ToolChoice::kAuto;
  std::string name;
  auto choice = ordered.find("tool_choice");
  if (choice != ordered.end() && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") {
        kind = ToolChoice::kNone;
      } else if (c == "auto") {
        kind = ToolChoice::kAuto;
      } else if (c == "required") {
        kind = ToolChoice::kRequired;
      } else {
        return BadField(
            "tool_choice",
            "must be \"none\", \"auto\", \"required\" or "
            "{\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
    } else if (!choice->is_object()) {
      return BadField("tool_choice", "must be a string or an object");
    } else {
      auto fn = choice->find("function");
      auto n = fn != choice->end() && fn->is_object() ? fn->find("name")
                                                      : choice->end();
      if (fn == choice->end() || !fn->is_object() || n == fn->end() ||
          !n->is_string()) {
        return BadField("tool_choice.function.name", "is required (a string)");
      }
      kind = ToolChoice::kNamed;
      name = n->get<std::string>();
    }
  }
  if (absl::Status st = SetToolChoice(kind, name, "tool_choice",
                                      "tool_choice.function.name", chat);
      !st.ok()) {
    return HttpErrorFromStatus(st);
  }
  return std::nullopt;
}

// The thinking switch and the reasoning effort: the request's
// chat_template_kwargs and top-level reasoning_effort over the server's
// defaults.
std::optional<HttpError> ParseReasoning(const json& body,
                                        const json& default_kwargs,
                                        text::ChatFormat format,
                                        ChatRequest& chat) {
  // What one source (the server's defaults, the request's kwargs, the
  // request's top level) says.
  struct Said {
    std::optional<bool> thinking;
    std::optional<std::string> effort;
  };
  auto effort_of = [](const json& v, const std::string& field,
                      Said& said) -> std::optional<HttpError> {
    if (v.is_string()) {
      said.effort = v.get<std::string>();
    } else if (v.is_number_integer()) {
      said.effort = std::to_string(v.get<int64_t>());
    } else {
      return BadField(field, "must be a string or an integer");
    }
    return std::nullopt;
  };
  auto read_kwargs = [&](const json& kw, const std::string& prefix,
                         Said& said) -> std::optional<HttpError> {
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto t = kw.find(key);
      if (t == kw.end() || t->is_null()) continue;
      if (!t->is_boolean()) return BadField(prefix + key, "must be a boolean");
      said.thinking = t->get<bool>();
    }
    auto e = kw.find("reasoning_effort");
    if (e != kw.end() && !e->is_null()) {
      return effort_of(*e, prefix + "reasoning_effort", said);
    }
    return std::nullopt;
  };
  Said server;
  Said client;
  if (default_kwargs.is_object()) {
    if (std::optional<HttpError> e = read_kwargs(default_kwargs, "", server)) {
      return e;
    }
  }
  if (auto kw = body.find("chat_template_kwargs");
      kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) {
      return BadField("chat_template_kwargs", "must be an object");
    }
    if (std::optional<HttpError> e =
            read_kwargs(*kw, "chat_template_kwargs.", client)) {
      return e;
    }
  }
  if (auto e = body.find("reasoning_effort");
      e != body.end() && !e->is_null()) {
    if (std::optional<HttpError> err =
            effort_of(*e, "reasoning_effort", client)) {
      return err;
    }
  }
  const std::optional<std::string> effort =
      client.effort.has_value() ? client.effort : server.effort;
  // An effort the client asks for turns thinking on, unless the client
  // turned it off; "none" turns it off.
  const bool thinking = client.thinking.value_or(
      client.effort.has_value() || server.thinking.value_or(false));
  if (absl::Status st =
          SetReasoning(format, thinking, effort, "reasoning_effort", chat);
      !st.ok()) {
    return HttpErrorFromStatus(st);
  }
  return std::nullopt;
}

}  // namespace

std::optional<HttpError> ParseChat(const json& body,
                                   const text::DeepSeekV4ChatTemplate& tmpl,
                                   const text::Tokenizer& tokenizer,
                                   const json& default_kwargs,
                                   const std::string& raw_body,
                                   OpenAiRequest& request) {
  ChatRequest& chat = request.chat_request;
  const text::ChatFormat format = tmpl.format();
  const bool v41 = format == text::ChatFormat::kV41;
  chat.v41 = v41;
  if (std::optional<HttpError> e = ParseMessageList(body, v41, chat.messages)) {
    return e;
  }
  if (body.contains("tools") || body.contains("tool_choice")) {
    // Again with the client's key order, which the tool schemas keep.
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(
        raw_body, nullptr, /*allow_exceptions=*/false);
    if (ordered.is_discarded()) return BadField("tools", "is not valid JSON");
    if (std::optional<HttpError> e = ParseTools(ordered, chat)) return e;
  }
  if (std::optional<HttpError> e =
          ParseReasoning(body, default_kwargs, format, chat)) {
    return e;
  }
  absl::StatusOr<std::vector<int64_t>> ids =
      RenderChatPrompt(tmpl, tokenizer, "messages", chat);
  if (!ids.ok()) {
    HttpError e = HttpErrorFromStatus(ids.status());
    if (e.param.empty()) e.param = "messages";
    return e;
  }
  request.prompts.push_back(*std::move(ids));
  request.prompt_texts.emplace_back(std::nullopt);
  return std::nullopt;
}

}  // namespace mneme::coordinator
