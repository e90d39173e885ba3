#include "services/coordinator/serving_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cluster_secret.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/chat_request.h"
#include "services/coordinator/request_validator.h"
#include "services/coordinator/text_stream.h"
#include "text/chat_output_parser.h"

namespace mneme::coordinator {
namespace {

namespace sv1 = serving::v1;

const grpc::Status kDraining(grpc::StatusCode::UNAVAILABLE,
                             "the coordinator is shutting down");

sv1::FinishReason ToProto(GenerateEnd end) {
  switch (end) {
    case GenerateEnd::kStop:
      return sv1::FINISH_REASON_STOP;
    case GenerateEnd::kLength:
      return sv1::FINISH_REASON_LENGTH;
    case GenerateEnd::kAbort:
      return sv1::FINISH_REASON_ABORT;
  }
  return sv1::FINISH_REASON_UNSPECIFIED;
}

// The parser's deltas into a response message.
void AddDeltas(const std::vector<text::ChatOutputDelta>& deltas,
               sv1::GenerateResponse& m) {
  for (const text::ChatOutputDelta& d : deltas) {
    switch (d.kind) {
      case text::ChatOutputDelta::kReasoning:
        m.mutable_reasoning_text()->append(d.text);
        break;
      case text::ChatOutputDelta::kContent:
        m.mutable_text()->append(d.text);
        break;
      case text::ChatOutputDelta::kToolCallBegin: {
        sv1::ToolCallDelta* c = m.add_tool_calls();
        c->set_index(d.index);
        c->set_id(d.id);
        c->set_name(d.name);
        break;
      }
      case text::ChatOutputDelta::kToolCallArguments: {
        // Fragments of the same call since the last piece merge into it.
        const int n = m.tool_calls_size();
        if (n > 0 && m.tool_calls(n - 1).index() == d.index) {
          m.mutable_tool_calls(n - 1)->mutable_arguments()->append(d.text);
        } else {
          sv1::ToolCallDelta* c = m.add_tool_calls();
          c->set_index(d.index);
          c->set_arguments(d.text);
        }
        break;
      }
    }
  }
}

void ToProto(const TopLogprobs& top, sv1::TopLogprobs& out) {
  out.mutable_token_ids()->Add(top.token_ids.begin(), top.token_ids.end());
  out.mutable_logprobs()->Add(top.logprobs.begin(), top.logprobs.end());
}

// The bytes a chat request's strings may hold in all.
constexpr size_t kMaxChatBytes = size_t{16} << 20;

absl::Status ChatMessageFromProto(const sv1::ChatMessage& m,
                                  const std::string& where,
                                  text::ChatMessage& out) {
  switch (m.role()) {
    case sv1::CHAT_ROLE_SYSTEM:
      out.role = text::ChatRole::kSystem;
      break;
    case sv1::CHAT_ROLE_USER:
      out.role = text::ChatRole::kUser;
      break;
    case sv1::CHAT_ROLE_ASSISTANT:
      out.role = text::ChatRole::kAssistant;
      break;
    case sv1::CHAT_ROLE_TOOL:
      out.role = text::ChatRole::kTool;
      break;
    case sv1::CHAT_ROLE_DEVELOPER:
      out.role = text::ChatRole::kDeveloper;
      break;
    case sv1::CHAT_ROLE_LATEST_REMINDER:
      out.role = text::ChatRole::kLatestReminder;
      break;
    default:
      return InvalidFieldError(
          where + ".role",
          absl::StrCat("is required: system, user, assistant, tool, "
                       "developer or latest_reminder (got ",
                       static_cast<int>(m.role()), ")"));
  }
  const bool assistant = out.role == text::ChatRole::kAssistant;
  if (!assistant && !m.reasoning_content().empty()) {
    return InvalidFieldError(where + ".reasoning_content",
                             "is for assistant messages only");
  }
  if (!assistant && m.tool_calls_size() > 0) {
    return InvalidFieldError(where + ".tool_calls",
                             "are for assistant messages only");
  }
  if (static_cast<size_t>(m.tool_calls_size()) > kMaxTools) {
    return InvalidFieldError(
        where + ".tool_calls",
        absl::StrCat("holds more than ", kMaxTools, " calls"));
  }
  if (out.role == text::ChatRole::kTool) {
    if (m.tool_call_id().empty()) {
      return InvalidFieldError(where + ".tool_call_id",
                               "is required in a tool message");
    }
  } else if (!m.tool_call_id().empty()) {
    return InvalidFieldError(where + ".tool_call_id",
                             "is for tool messages only");
  }
  out.content = m.content();
  out.reasoning_content = m.reasoning_content();
  out.tool_call_id = m.tool_call_id();
  for (int i = 0; i < m.tool_calls_size(); ++i) {
    const sv1::ToolCall& c = m.tool_calls(i);
    const std::string at = absl::StrCat(where, ".tool_calls[", i, "]");
    if (c.name().empty()) {
      return InvalidFieldError(at + ".name", "is required");
    }
    text::ToolCall call;
    call.id = c.id();
    call.name = c.name();
    call.arguments = c.arguments().empty() ? "{}" : c.arguments();
    const nlohmann::json args = nlohmann::json::parse(
        call.arguments, nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) {
      return InvalidFieldError(at + ".arguments",
                               "must be the text of a JSON object");
    }
    out.tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

size_t ChatBytes(const sv1::Chat& chat) {
  size_t n = chat.reasoning_effort().size();
  for (const std::string& t : chat.tool_functions()) n += t.size();
  for (const sv1::ChatMessage& m : chat.messages()) {
    n += m.content().size() + m.reasoning_content().size() +
         m.tool_call_id().size();
    for (const sv1::ToolCall& c : m.tool_calls()) {
      n += c.id().size() + c.name().size() + c.arguments().size();
    }
  }
  return n;
}

// The request's chat, checked, as the chat template takes it. Errors name
// the field (chat.messages[i].role, chat.tool_functions[i], ...).
absl::Status ChatFromProto(const sv1::Chat& in, text::ChatFormat format,
                           ChatRequest& chat) {
  if (in.messages_size() == 0) {
    return InvalidFieldError("chat.messages", "is required (1 or more)");
  }
  if (static_cast<size_t>(in.messages_size()) > kMaxMessages) {
    return InvalidFieldError(
        "chat.messages",
        absl::StrCat("holds more than ", kMaxMessages, " messages"));
  }
  if (static_cast<size_t>(in.tool_functions_size()) > kMaxTools) {
    return InvalidFieldError(
        "chat.tool_functions",
        absl::StrCat("holds more than ", kMaxTools, " tools"));
  }
  if (ChatBytes(in) > kMaxChatBytes) {
    return InvalidFieldError(
        "chat", absl::StrCat("holds more than ", kMaxChatBytes, " bytes"));
  }
  chat.messages.resize(static_cast<size_t>(in.messages_size()));
  for (int i = 0; i < in.messages_size(); ++i) {
    RETURN_IF_ERROR(ChatMessageFromProto(
        in.messages(i), absl::StrCat("chat.messages[", i, "]"),
        chat.messages[static_cast<size_t>(i)]));
  }
  for (int i = 0; i < in.tool_functions_size(); ++i) {
    const std::string where = absl::StrCat("chat.tool_functions[", i, "]");
    const nlohmann::ordered_json fn = nlohmann::ordered_json::parse(
        in.tool_functions(i), nullptr, /*allow_exceptions=*/false);
    if (fn.is_discarded()) {
      return InvalidFieldError(where, "is not valid JSON");
    }
    RETURN_IF_ERROR(AddChatTool(fn, where, chat));
  }
  ToolChoice choice = ToolChoice::kAuto;
  switch (in.tool_choice().mode()) {
    case sv1::ToolChoice::MODE_UNSPECIFIED:
    case sv1::ToolChoice::MODE_AUTO:
      break;
    case sv1::ToolChoice::MODE_NONE:
      choice = ToolChoice::kNone;
      break;
    case sv1::ToolChoice::MODE_REQUIRED:
      choice = ToolChoice::kRequired;
      break;
    case sv1::ToolChoice::MODE_NAMED:
      choice = ToolChoice::kNamed;
      break;
    default:
      return InvalidFieldError(
          "chat.tool_choice.mode",
          absl::StrCat("is not a known mode (got ",
                       static_cast<int>(in.tool_choice().mode()), ")"));
  }
  if (choice != ToolChoice::kNamed && !in.tool_choice().name().empty()) {
    return InvalidFieldError("chat.tool_choice.name",
                             "is for mode MODE_NAMED only");
  }
  RETURN_IF_ERROR(SetToolChoice(choice, in.tool_choice().name(),
                                "chat.tool_choice.mode",
                                "chat.tool_choice.name", chat));
  std::optional<std::string> effort;
  if (in.has_reasoning_effort()) effort = in.reasoning_effort();
  const bool thinking =
      in.has_thinking() ? in.thinking() : in.has_reasoning_effort();
  return SetReasoning(format, thinking, effort, "chat.reasoning_effort", chat);
}

class GenerateReactor;

// What the engine holds of a stream: forwards events to the reactor until
// the reactor is done (then drops them).
class StreamSink final : public GenerateSink {
 public:
  explicit StreamSink(GenerateReactor* reactor) : reactor_(reactor) {}
  void OnPromptLogprobs(absl::Span<const TokenLogprobs> positions) override;
  void OnTopLogprobs(absl::Span<const TopLogprobs> per_token) override;
  void OnSpeculation(const SpeculationUsage& usage) override;
  bool OnTokens(absl::Span<const int64_t> tokens,
                absl::Span<const float> logprobs) override;
  void OnFinish(const absl::Status& status, GenerateEnd end,
                int64_t prompt_tokens, int64_t completion_tokens) override;
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  GenerateReactor* reactor_ ABSL_GUARDED_BY(mu_);
};

class GenerateReactor final
    : public grpc::ServerWriteReactor<sv1::GenerateResponse> {
 public:
  GenerateReactor(Engine* engine, TextCodec* codec, InflightGate::Pass pass)
      : engine_(engine), codec_(codec), pass_(std::move(pass)) {}

  void Start(const sv1::GenerateRequest& request) {
    sink_ = std::make_shared<StreamSink>(this);
    GenerateParams params = ParamsFromProto(request);
    if (absl::Status st = Validate(request, params); !st.ok()) {
      absl::MutexLock lock(&mu_);
      finishing_ = true;
      final_ = ToGrpcStatus(st);
      WriteNextLocked();
      return;
    }
    if (params.request_id.empty()) {
      static std::atomic<uint64_t> counter{0};
      params.request_id = absl::StrCat("gen-", absl::ToUnixMicros(absl::Now()),
                                       "-", counter.fetch_add(1));
    }
    {
      // Named before it can produce tokens.
      absl::MutexLock lock(&mu_);
      id_ = params.request_id;
    }
    absl::StatusOr<std::string> id = engine_->Submit(std::move(params), sink_);
    absl::MutexLock lock(&mu_);
    if (!id.ok()) {
      id_.clear();
      finishing_ = true;
      final_ = ToGrpcStatus(id.status());
      WriteNextLocked();
      return;
    }
    // The first message names the request at once (for Abort), unless the
    // engine's first tokens already did: every message carries the id.
    if (!named_) NextMessageLocked();
    WriteNextLocked();
  }

  void PushPromptLogprobs(absl::Span<const TokenLogprobs> positions) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    sv1::GenerateResponse& m = NextMessageLocked();
    for (const TokenLogprobs& t : positions) {
      sv1::PromptTokenLogprob* p = m.add_prompt_logprobs();
      p->set_token_id(t.token_id);
      if (t.logprob.has_value()) p->set_logprob(*t.logprob);
      ToProto(t.top, *p->mutable_top());
    }
    WriteNextLocked();
  }

  // Held until the tokens they belong to (a write may start in between).
  void PushTopLogprobs(absl::Span<const TopLogprobs> per_token) {
    absl::MutexLock lock(&mu_);
    pending_top_.insert(pending_top_.end(), per_token.begin(), per_token.end());
  }

  // False once a stop string ended the text.
  bool Push(absl::Span<const int64_t> tokens,
            absl::Span<const float> logprobs) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return true;
    sv1::GenerateResponse& m = NextMessageLocked();
    m.mutable_token_ids()->Add(tokens.begin(), tokens.end());
    m.mutable_logprobs()->Add(logprobs.begin(), logprobs.end());
    for (const TopLogprobs& top : pending_top_) {
      ToProto(top, *m.add_top_logprobs());
    }
    pending_top_.clear();
    if (text_ != nullptr) RouteLocked(text_->Add(tokens), /*final=*/false, m);
    WriteNextLocked();
    return text_ == nullptr || !text_->stopped();
  }

  void PushFinish(const absl::Status& status, GenerateEnd end,
                  int64_t prompt_tokens, int64_t completion_tokens) {
    absl::MutexLock lock(&mu_);
    if (finishing_) return;
    finishing_ = true;
    if (!status.ok()) {
      final_ = ToGrpcStatus(status);
    } else {
      sv1::GenerateResponse& m = NextMessageLocked();
      if (text_ != nullptr) RouteLocked(text_->Finish(), /*final=*/true, m);
      m.set_finish_reason(ToProto(end));
      if (parser_ != nullptr && parser_->saw_tool_calls() &&
          end != GenerateEnd::kAbort) {
        m.set_finish_reason(sv1::FINISH_REASON_TOOL_CALLS);
      }
      m.set_prompt_tokens(static_cast<int32_t>(prompt_tokens));
      m.set_completion_tokens(static_cast<int32_t>(completion_tokens));
      if (speculation_.drafts > 0) {
        sv1::SpeculativeDecoding* s = m.mutable_speculative_decoding();
        s->set_num_drafts(speculation_.drafts);
        s->set_num_draft_tokens(speculation_.draft_tokens);
        s->set_num_accepted_tokens(speculation_.accepted_tokens);
      }
    }
    WriteNextLocked();
  }

  void SetSpeculation(const SpeculationUsage& usage) {
    absl::MutexLock lock(&mu_);
    speculation_ = usage;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The client is gone; the request is aborted in OnCancel / OnDone.
      broken_ = true;
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
      }
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override { AbortRequest(); }

  void OnDone() override {
    sink_->Detach();
    AbortRequest();
    delete this;
  }

 private:
  // New decoded text into the message: as it is for a text prompt, split
  // by the output parser for a chat (which first reads the forced call's
  // opening that the prompt holds). `final`: the end of the answer.
  void RouteLocked(const std::string& text, bool final,
                   sv1::GenerateResponse& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (parser_ == nullptr) {
      m.mutable_text()->append(text);
      return;
    }
    if (!forced_prefix_.empty()) {
      AddDeltas(parser_->Feed(forced_prefix_), m);
      forced_prefix_.clear();
    }
    if (!text.empty()) AddDeltas(parser_->Feed(text), m);
    if (final) AddDeltas(parser_->Finish(), m);
  }

  // A text or chat prompt becomes token ids, and the stream's text is
  // decoded (and, for a chat, parsed).
  absl::Status TextPrompt(const sv1::GenerateRequest& request,
                          GenerateParams& params) {
    const int forms = (request.token_ids_size() > 0 ? 1 : 0) +
                      (request.prompt().empty() ? 0 : 1) +
                      (request.has_chat() ? 1 : 0);
    if (forms > 1) {
      if (request.has_chat()) {
        return InvalidFieldError(
            "chat", "is a prompt: give token_ids, prompt or chat, not two");
      }
      return absl::InvalidArgumentError(
          "give the prompt as token_ids or as text, not both");
    }
    if (request.prompt().empty() && !request.has_chat()) {
      if (request.stop_size() > 0) {
        return absl::InvalidArgumentError(
            "stop strings need a text prompt (use stop_token_ids)");
      }
      return absl::OkStatus();
    }
    if (request.prompt().size() > kMaxPromptTextBytes) {
      return InvalidFieldError(
          "prompt", absl::StrCat("is ", request.prompt().size(),
                                 " bytes, more than ", kMaxPromptTextBytes));
    }
    // The count before any copy: a message may hold millions of strings.
    if (static_cast<size_t>(request.stop_size()) > kMaxStopStrings) {
      return InvalidFieldError(
          "stop", absl::StrCat("has ", request.stop_size(),
                               " strings, more than ", kMaxStopStrings));
    }
    RETURN_IF_ERROR(ValidateStopStrings(
        std::vector<std::string>(request.stop().begin(), request.stop().end()),
        "stop"));
    if (codec_ == nullptr) {
      return absl::FailedPreconditionError("this server has no tokenizer");
    }
    ASSIGN_OR_RETURN(const text::Tokenizer* tokenizer, codec_->tokenizer());
    std::unique_ptr<text::ChatOutputParser> parser;
    std::string forced_prefix;
    if (request.has_chat()) {
      ASSIGN_OR_RETURN(const text::DeepSeekV4ChatTemplate* tmpl,
                       codec_->chat_template());
      ChatRequest chat;
      RETURN_IF_ERROR(ChatFromProto(request.chat(), tmpl->format(), chat));
      absl::StatusOr<std::vector<int64_t>> ids =
          RenderChatPrompt(*tmpl, *tokenizer, "chat.messages", chat);
      if (!ids.ok()) {
        if (!InvalidFieldName(ids.status()).empty() ||
            ids.status().code() != absl::StatusCode::kInvalidArgument) {
          return ids.status();
        }
        return InvalidFieldError("chat.messages", ids.status().message());
      }
      params.prompt = *std::move(ids);
      parser = std::make_unique<text::ChatOutputParser>(
          ChatParserOptions(chat, params.sampling.seed()));
      forced_prefix = chat.forced_prefix;
    } else {
      ASSIGN_OR_RETURN(
          params.prompt,
          tokenizer->Encode(request.prompt(), text::AddSpecialTokens::kYes));
    }
    absl::MutexLock lock(&mu_);
    text_ = std::make_unique<TextStream>(
        *tokenizer,
        std::vector<std::string>(request.stop().begin(), request.stop().end()));
    parser_ = std::move(parser);
    forced_prefix_ = std::move(forced_prefix);
    return absl::OkStatus();
  }

  // The request as the engine will run it (the text prompt tokenized),
  // checked by the one validator both fronts share.
  absl::Status Validate(const sv1::GenerateRequest& request,
                        GenerateParams& params) {
    RETURN_IF_ERROR(TextPrompt(request, params));
    RequestFieldNames names;
    if (!request.prompt().empty()) names.prompt = "prompt";
    if (request.has_chat()) names.prompt = "chat.messages";
    const absl::StatusOr<ModelInfo> model = engine_->model_info();
    return ValidateGenerateRequest(params, request.stop_size(),
                                   model.ok() ? &*model : nullptr, names);
  }

  void AbortRequest() {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      if (finishing_ || id_.empty()) return;
      id = id_;
    }
    // NotFound when it finished meanwhile: nothing to abort.
    (void)engine_->Abort(id);
  }

  // The message not yet written that new events go into (coalescing them
  // while a write is in flight).
  sv1::GenerateResponse& NextMessageLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty()) {
      queue_.emplace_back();
      queue_.back().set_request_id(id_);
      named_ = true;
    }
    return queue_.back();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || broken_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&current_);
      return;
    }
    if (finishing_) {
      finished_ = true;
      Finish(final_);
    }
  }

  Engine* const engine_;
  TextCodec* const codec_;
  InflightGate::Pass pass_;
  std::shared_ptr<StreamSink> sink_;
  absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
  std::deque<sv1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  sv1::GenerateResponse current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  SpeculationUsage speculation_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // Whether a message (all carry the request id) was queued.
  bool named_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<TextStream> text_ ABSL_GUARDED_BY(mu_);
  // Chat prompts: the answer's parser, and the forced call's opening it
  // has not read yet.
  std::unique_ptr<text::ChatOutputParser> parser_ ABSL_GUARDED_BY(mu_);
  std::string forced_prefix_ ABSL_GUARDED_BY(mu_);
  std::vector<TopLogprobs> pending_top_ ABSL_GUARDED_BY(mu_);
};

void StreamSink::OnPromptLogprobs(absl::Span<const TokenLogprobs> positions) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->PushPromptLogprobs(positions);
}

void StreamSink::OnTopLogprobs(absl::Span<const TopLogprobs> per_token) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->PushTopLogprobs(per_token);
}

bool StreamSink::OnTokens(absl::Span<const int64_t> tokens,
                          absl::Span<const float> logprobs) {
  absl::MutexLock lock(&mu_);
  return reactor_ == nullptr || reactor_->Push(tokens, logprobs);
}

void StreamSink::OnSpeculation(const SpeculationUsage& usage) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->SetSpeculation(usage);
}

void StreamSink::OnFinish(const absl::Status& status, GenerateEnd end,
                          int64_t prompt_tokens, int64_t completion_tokens) {
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) {
    reactor_->PushFinish(status, end, prompt_tokens, completion_tokens);
  }
}

// A write reactor that fails at once.
class FailedReactor final
    : public grpc::ServerWriteReactor<sv1::GenerateResponse> {
 public:
  explicit FailedReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

GenerateParams ParamsFromProto(const sv1::GenerateRequest& request) {
  GenerateParams p;
  p.request_id = request.request_id();
  p.prompt.assign(request.token_ids().begin(), request.token_ids().end());
  const sv1::SamplingParams& s = request.sampling();
  p.sampling.set_temperature(s.temperature());
  p.sampling.set_top_p(s.top_p());
  p.sampling.set_top_k(s.top_k());
  p.sampling.set_min_p(s.min_p());
  p.sampling.set_seed(s.seed());
  p.max_new_tokens = request.max_new_tokens() == 0 ? kDefaultMaxNewTokens
                                                   : request.max_new_tokens();
  p.stop_token_ids.assign(request.stop_token_ids().begin(),
                          request.stop_token_ids().end());
  p.ignore_eos = request.ignore_eos();
  p.logprobs = request.logprobs();
  p.top_logprobs = request.top_logprobs();
  p.prompt_logprobs =
      request.has_prompt_logprobs() ? request.prompt_logprobs() : -1;
  p.speculative = !request.disable_speculative_decoding();
  return p;
}

absl::StatusOr<std::unique_ptr<ServingService>> ServingService::Create(
    Engine* engine, InflightGate* gate, TextCodec* codec, std::string api_key) {
  if (engine == nullptr || gate == nullptr) {
    return absl::InvalidArgumentError("engine and gate are required");
  }
  return std::unique_ptr<ServingService>(
      new ServingService(engine, gate, codec, std::move(api_key)));
}

grpc::ServerWriteReactor<sv1::GenerateResponse>* ServingService::Generate(
    grpc::CallbackServerContext* context, const sv1::GenerateRequest* request) {
  if (absl::Status st = CheckApiKey(*context, api_key_); !st.ok()) {
    return new FailedReactor(ToGrpcStatus(st));
  }
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) return new FailedReactor(kDraining);
  auto* reactor = new GenerateReactor(engine_, codec_, *std::move(pass));
  reactor->Start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* ServingService::Abort(
    grpc::CallbackServerContext* context, const sv1::AbortRequest* request,
    sv1::AbortResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = CheckApiKey(*context, api_key_); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  reactor->Finish(ToGrpcStatus(engine_->Abort(request->request_id())));
  return reactor;
}

grpc::ServerUnaryReactor* ServingService::GetModelInfo(
    grpc::CallbackServerContext* context,
    const sv1::GetModelInfoRequest* /*request*/,
    sv1::GetModelInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = CheckApiKey(*context, api_key_); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  absl::StatusOr<ModelInfo> info = engine_->model_info();
  if (!info.ok()) {
    reactor->Finish(ToGrpcStatus(absl::UnavailableError(
        absl::StrCat("the cluster is not ready: ", info.status().message()))));
    return reactor;
  }
  response->set_checkpoint(info->checkpoint);
  response->set_vocab_size(info->vocab_size);
  response->set_eos_token_id(info->eos_token_id);
  response->set_max_context_tokens(info->max_context_tokens);
  response->set_tp_size(info->tp_size);
  response->set_dcp_size(info->dcp_size);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ServingService::GetLoads(
    grpc::CallbackServerContext* context,
    const sv1::GetLoadsRequest* /*request*/, sv1::GetLoadsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = CheckApiKey(*context, api_key_); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  const Loads l = engine_->loads();
  response->set_running_requests(static_cast<int32_t>(l.running));
  response->set_waiting_requests(static_cast<int32_t>(l.waiting));
  response->set_kv_cache_usage(l.kv_usage);
  response->set_waiting_tokens(l.waiting_tokens);
  response->set_preemptions(l.preemptions);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace mneme::coordinator
