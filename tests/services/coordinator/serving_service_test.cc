// The public gRPC Serving API in process (127.0.0.1, any port) over an
// engine with a fake worker group: validation errors are INVALID_ARGUMENT
// naming the field, a streamed generation, text prompts, Abort, model info
// and a worker failure reaching the stream.

#include "services/coordinator/serving_service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_channel.h"
#include "common/inflight_gate.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "services/common/server_runner.h"
#include "services/coordinator/chat_request.h"
#include "services/coordinator/openai_request.h"
#include "tests/services/coordinator/test_engine.h"
#include "text/chat_template.h"

namespace mneme::coordinator {
namespace {

namespace sv1 = ::mneme::serving::v1;
using ::mneme::coordinator::testing::TestEngine;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int64_t> Expected(int prompt_length, int n) {
  std::vector<int64_t> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i)
    out.push_back(TestEngine::Token(prompt_length + i));
  return out;
}

sv1::GenerateRequest Request(std::vector<int64_t> prompt, int max_new) {
  sv1::GenerateRequest r;
  r.mutable_token_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_new_tokens(max_new);
  r.mutable_sampling()->set_top_p(1);
  return r;
}

struct Outcome {
  grpc::Status status;
  std::vector<sv1::GenerateResponse> messages;
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  std::string reasoning;
  std::vector<sv1::ToolCallDelta> tool_calls;
};

sv1::ChatMessage Message(sv1::ChatRole role, const std::string& content) {
  sv1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

sv1::GenerateRequest ChatRequestOf(std::vector<sv1::ChatMessage> messages,
                                   int max_new) {
  sv1::GenerateRequest r;
  for (sv1::ChatMessage& m : messages) {
    *r.mutable_chat()->add_messages() = std::move(m);
  }
  r.set_max_new_tokens(max_new);
  r.set_ignore_eos(true);
  return r;
}

constexpr char kWeatherTool[] =
    R"({"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"}}}})";

class ServingServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve(/*with_codec=*/true); }

  void Serve(bool with_codec, int64_t max_context_tokens = 256,
             const std::string& api_key = "") {
    absl::StatusOr<std::unique_ptr<TestEngine>> t =
        TestEngine::Create({}, max_context_tokens);
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *std::move(t);
    gate_ = std::make_unique<InflightGate>();
    absl::StatusOr<std::unique_ptr<ServingService>> service =
        ServingService::Create(t_->engine.get(), gate_.get(),
                               with_codec ? t_->codec.get() : nullptr, api_key);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    absl::StatusOr<std::unique_ptr<ServerRunner>> runner =
        ServerRunner::Create(ServerOptions(), {service_.get()}, gate_.get());
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateClientChannel(runner_->address().ToString(), {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    stub_ = sv1::Serving::NewStub(*channel);
  }

  // A stub whose channel sends `api_key` as a bearer token.
  std::unique_ptr<sv1::Serving::Stub> StubWithKey(const std::string& api_key) {
    ClientChannelOptions options;
    options.api_key = api_key;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateClientChannel(runner_->address().ToString(), options);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return sv1::Serving::NewStub(*channel);
  }

  void TearDown() override {
    if (runner_ != nullptr) runner_->Drain();
    if (t_ != nullptr) t_->engine->Stop();
  }

  Outcome Generate(const sv1::GenerateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    std::unique_ptr<grpc::ClientReader<sv1::GenerateResponse>> reader =
        stub_->Generate(&context, request);
    Outcome o;
    sv1::GenerateResponse m;
    while (reader->Read(&m)) {
      o.tokens.insert(o.tokens.end(), m.token_ids().begin(),
                      m.token_ids().end());
      o.logprobs.insert(o.logprobs.end(), m.logprobs().begin(),
                        m.logprobs().end());
      o.text += m.text();
      o.reasoning += m.reasoning_text();
      for (const sv1::ToolCallDelta& c : m.tool_calls()) {
        o.tool_calls.push_back(c);
      }
      o.messages.push_back(m);
    }
    o.status = reader->Finish();
    return o;
  }

  std::unique_ptr<TestEngine> t_;
  std::unique_ptr<InflightGate> gate_;
  std::unique_ptr<ServingService> service_;
  std::unique_ptr<ServerRunner> runner_;
  std::unique_ptr<sv1::Serving::Stub> stub_;
};

TEST_F(ServingServiceTest, StreamsAGeneration) {
  sv1::GenerateRequest r = Request({5, 6, 7}, 4);
  r.set_request_id("mine");
  r.set_ignore_eos(true);
  r.set_logprobs(true);
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  ASSERT_GE(o.messages.size(), 1u);
  // Every message names the request; only the last one finishes it.
  for (const sv1::GenerateResponse& m : o.messages) {
    EXPECT_EQ(m.request_id(), "mine");
  }
  EXPECT_EQ(o.tokens, Expected(3, 4));
  EXPECT_EQ(o.logprobs.size(), 4u);
  EXPECT_THAT(o.logprobs, Each(-0.5f));
  const sv1::GenerateResponse& last = o.messages.back();
  EXPECT_EQ(last.finish_reason(), sv1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.prompt_tokens(), 3);
  EXPECT_EQ(last.completion_tokens(), 4);
  for (size_t i = 0; i + 1 < o.messages.size(); ++i) {
    EXPECT_EQ(o.messages[i].finish_reason(), sv1::FINISH_REASON_UNSPECIFIED);
  }
}

TEST_F(ServingServiceTest, DefaultsAndStopTokens) {
  // max_new_tokens 0 is the default (16); no logprobs unless asked.
  sv1::GenerateRequest r = Request({5}, 0);
  Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, Expected(1, 16));
  EXPECT_THAT(o.logprobs, IsEmpty());
  EXPECT_FALSE(o.messages.front().request_id().empty());

  r = Request({5}, 10);
  r.add_stop_token_ids(Expected(1, 2)[1]);
  o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, Expected(1, 2));
  EXPECT_EQ(o.messages.back().finish_reason(), sv1::FINISH_REASON_STOP);
}

TEST_F(ServingServiceTest, InvalidRequestsAreInvalidArgumentNamingTheField) {
  struct Case {
    sv1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({Request({}, 4), "'token_ids'"});
  cases.push_back({Request({5}, -1), "'max_new_tokens'"});
  cases.push_back({Request({5}, 4), "'stop_token_ids'"});
  cases.back().request.add_stop_token_ids(1 << 30);
  cases.push_back({Request(std::vector<int64_t>(300, 5), 4), "'token_ids'"});
  cases.push_back({Request({5, 1 << 30}, 4), "'token_ids'"});
  cases.push_back({Request({5}, 4), "'temperature'"});
  cases.back().request.mutable_sampling()->set_temperature(2e4);
  cases.push_back({Request({5}, 4), "'top_p'"});
  cases.back().request.mutable_sampling()->set_top_p(1.5);
  cases.push_back({Request({5}, 4), "'top_k'"});
  cases.back().request.mutable_sampling()->set_top_k(-1);
  cases.push_back({Request({5}, 4), "'min_p'"});
  cases.back().request.mutable_sampling()->set_min_p(-0.5);
  cases.push_back({Request({5}, 4), "'request_id'"});
  cases.back().request.set_request_id(std::string(200, 'r'));
  // Text-only fields.
  cases.push_back({Request({5}, 4), "stop strings need a text prompt"});
  cases.back().request.add_stop("x");
  cases.push_back({Request({5}, 4), "not both"});
  cases.back().request.set_prompt("hello");
  cases.push_back({Request({}, 4), "'stop'"});
  cases.back().request.set_prompt("hello");
  for (int i = 0; i < 17; ++i) cases.back().request.add_stop("s");
  cases.push_back({Request({}, 300), "'prompt'"});
  cases.back().request.set_prompt("hello");
  cases.push_back({Request({5}, 4), "'top_logprobs'"});
  cases.back().request.set_logprobs(true);
  cases.back().request.set_top_logprobs(21);
  cases.push_back({Request({5}, 4), "'top_logprobs' needs 'logprobs'"});
  cases.back().request.set_top_logprobs(2);
  cases.push_back({Request({5}, 4), "'prompt_logprobs'"});
  cases.back().request.set_prompt_logprobs(21);
  for (const Case& c : cases) {
    const Outcome o = Generate(c.request);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << o.status.error_message();
    EXPECT_THAT(o.status.error_message(), HasSubstr(c.field));
    EXPECT_THAT(o.tokens, IsEmpty());
  }
  EXPECT_TRUE(t_->workers->steps().empty());
  EXPECT_TRUE(Generate(Request({5}, 1)).status.ok());
}

TEST_F(ServingServiceTest, PromptAndTopLogprobs) {
  sv1::GenerateRequest r = Request({5, 6, 7, 8}, 3);
  r.set_ignore_eos(true);
  r.set_logprobs(true);
  r.set_top_logprobs(2);
  r.set_prompt_logprobs(1);
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  ASSERT_EQ(o.tokens, Expected(4, 3));
  // The prompt's entries come in one message, before or with the first
  // token; each token's top list in the message that carries it.
  std::vector<sv1::PromptTokenLogprob> prompt;
  std::vector<sv1::TopLogprobs> tops;
  size_t tokens_before_prompt = 0;
  for (const sv1::GenerateResponse& m : o.messages) {
    if (m.prompt_logprobs_size() > 0) {
      EXPECT_TRUE(prompt.empty()) << "prompt logprobs twice";
      prompt.assign(m.prompt_logprobs().begin(), m.prompt_logprobs().end());
      tokens_before_prompt = tops.size();
    }
    EXPECT_EQ(m.top_logprobs_size(), m.token_ids_size());
    tops.insert(tops.end(), m.top_logprobs().begin(), m.top_logprobs().end());
  }
  EXPECT_EQ(tokens_before_prompt, 0u);
  ASSERT_EQ(prompt.size(), 4u);
  EXPECT_EQ(prompt[0].token_id(), 5);
  EXPECT_FALSE(prompt[0].has_logprob());
  EXPECT_EQ(prompt[0].top().token_ids_size(), 0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(prompt[i].token_id(), 5 + i);
    ASSERT_TRUE(prompt[i].has_logprob());
    EXPECT_EQ(prompt[i].logprob(),
              testing::FakeWorkerGroup::PromptLogprob(i - 1));
    EXPECT_THAT(prompt[i].top().token_ids(),
                ::testing::ElementsAre(testing::FakeWorkerGroup::FakeTopId(0)));
  }
  ASSERT_EQ(tops.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_THAT(tops[i].token_ids(),
                ::testing::ElementsAre(o.tokens[i],
                                       testing::FakeWorkerGroup::FakeTopId(1)));
    EXPECT_THAT(tops[i].logprobs(), ::testing::ElementsAre(-0.5f, -1.5f));
  }
  // Without them: none.
  const Outcome plain = Generate(Request({5, 6}, 2));
  ASSERT_TRUE(plain.status.ok());
  for (const sv1::GenerateResponse& m : plain.messages) {
    EXPECT_EQ(m.prompt_logprobs_size(), 0);
    EXPECT_EQ(m.top_logprobs_size(), 0);
  }
}

TEST_F(ServingServiceTest, TextPromptStreamsText) {
  sv1::GenerateRequest r;
  r.set_prompt("hello world");
  r.set_max_new_tokens(6);
  r.set_ignore_eos(true);
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  std::string all;
  for (const sv1::GenerateResponse& m : o.messages) all += m.DebugString();
  EXPECT_EQ(o.tokens.size(), 6u) << all;
  EXPECT_EQ(o.messages.back().finish_reason(), sv1::FINISH_REASON_LENGTH)
      << all;
  // The prompt was tokenized: the workers saw its ids.
  const std::vector<worker::v1::StepRequest> steps = t_->workers->steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].chunks(0).token_ids_size(),
            o.messages.back().prompt_tokens());
  // The streamed text is the decoding of the streamed tokens.
  absl::StatusOr<const text::Tokenizer*> tokenizer = t_->codec->tokenizer();
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(o.text,
            (*tokenizer)->Decode(o.tokens, text::SkipSpecialTokens::kYes));
}

TEST_F(ServingServiceTest, TextPromptWithoutTokenizerIsFailedPrecondition) {
  TearDown();
  stub_.reset();
  runner_.reset();
  service_.reset();
  gate_.reset();
  t_.reset();
  Serve(/*with_codec=*/false);
  sv1::GenerateRequest r;
  r.set_prompt("hello");
  EXPECT_EQ(Generate(r).status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Generate(ChatRequestOf({Message(sv1::CHAT_ROLE_USER, "hi")}, 2))
                .status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServingServiceTest, AbortModelInfoAndLoads) {
  grpc::ClientContext abort_context;
  sv1::AbortRequest abort;
  abort.set_request_id("nobody");
  sv1::AbortResponse abort_response;
  EXPECT_EQ(stub_->Abort(&abort_context, abort, &abort_response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext info_context;
  sv1::GetModelInfoResponse info;
  ASSERT_TRUE(
      stub_->GetModelInfo(&info_context, sv1::GetModelInfoRequest(), &info)
          .ok());
  EXPECT_EQ(info.checkpoint(), "/fake/checkpoint");
  EXPECT_EQ(info.vocab_size(), t_->engine->model_info()->vocab_size);
  EXPECT_EQ(info.max_context_tokens(), 256);
  EXPECT_EQ(info.tp_size(), 1);

  grpc::ClientContext loads_context;
  sv1::GetLoadsResponse loads;
  ASSERT_TRUE(
      stub_->GetLoads(&loads_context, sv1::GetLoadsRequest(), &loads).ok());
  EXPECT_EQ(loads.running_requests(), 0);
  EXPECT_EQ(loads.waiting_requests(), 0);
}

// With an API key every call must carry "authorization: Bearer <key>".
TEST_F(ServingServiceTest, TheApiKeyGuardsEveryCall) {
  runner_->Drain();
  t_->engine->Stop();
  Serve(/*with_codec=*/true, 256, "s3cret");
  sv1::GenerateRequest request;
  request.add_token_ids(5);
  request.set_max_new_tokens(2);
  // Without a key, with a wrong one, and with the right one.
  for (const auto& [key, code] :
       std::vector<std::pair<std::string, grpc::StatusCode>>{
           {"", grpc::StatusCode::UNAUTHENTICATED},
           {"s3cre", grpc::StatusCode::UNAUTHENTICATED},
           {"s3cret", grpc::StatusCode::OK}}) {
    std::unique_ptr<sv1::Serving::Stub> stub =
        key.empty() ? std::move(stub_) : StubWithKey(key);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = stub->Generate(&context, request);
    sv1::GenerateResponse m;
    int tokens = 0;
    while (reader->Read(&m)) tokens += m.token_ids_size();
    const grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), code)
        << "key '" << key << "': " << st.error_message();
    EXPECT_EQ(tokens, code == grpc::StatusCode::OK ? 2 : 0);
    grpc::ClientContext info_context;
    sv1::GetModelInfoResponse info;
    EXPECT_EQ(stub->GetModelInfo(&info_context, {}, &info).error_code(), code);
    grpc::ClientContext loads_context;
    sv1::GetLoadsResponse loads;
    EXPECT_EQ(stub->GetLoads(&loads_context, {}, &loads).error_code(), code);
    grpc::ClientContext abort_context;
    sv1::AbortRequest abort;
    abort.set_request_id("nobody");
    sv1::AbortResponse aborted;
    EXPECT_EQ(
        stub->Abort(&abort_context, abort, &aborted).error_code(),
        code == grpc::StatusCode::OK ? grpc::StatusCode::NOT_FOUND : code);
  }
}

TEST_F(ServingServiceTest, AbortEndsTheStreamWithAbort) {
  t_->workers->Pause();
  sv1::GenerateRequest r = Request({5, 6}, 50);
  r.set_request_id("long");
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  std::unique_ptr<grpc::ClientReader<sv1::GenerateResponse>> reader =
      stub_->Generate(&context, r);
  sv1::GenerateResponse hello;
  ASSERT_TRUE(reader->Read(&hello));
  EXPECT_EQ(hello.request_id(), "long");
  ASSERT_TRUE(t_->workers->AwaitPausedStep(absl::Seconds(30)));
  grpc::ClientContext abort_context;
  sv1::AbortRequest abort;
  abort.set_request_id("long");
  sv1::AbortResponse abort_response;
  ASSERT_TRUE(stub_->Abort(&abort_context, abort, &abort_response).ok());
  t_->workers->Resume();
  sv1::GenerateResponse m, last;
  while (reader->Read(&m)) last = m;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.finish_reason(), sv1::FINISH_REASON_ABORT);
  EXPECT_EQ(last.completion_tokens(), 0);
}

// A request that keeps losing its workers (each loss is recomputed up to
// kMaxRecoveries times) ends with UNAVAILABLE.
TEST_F(ServingServiceTest, WorkerFailureEndsTheStreamUnavailable) {
  t_->workers->FailNextSteps(absl::UnavailableError("worker 0 (h:0): gone"),
                             kMaxRecoveries + 1);
  const Outcome o = Generate(Request({5, 6}, 4));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << o.status.error_message();
  EXPECT_THAT(o.tokens, IsEmpty());
}

text::ChatMessage TextMessage(text::ChatRole role, const std::string& content) {
  text::ChatMessage m;
  m.role = role;
  m.content = content;
  return m;
}

// Chat prompts (with a tool's schema) are longer than 256 tokens.
class ServingChatTest : public ServingServiceTest {
 protected:
  void SetUp() override { Serve(/*with_codec=*/true, 4096); }

  // The prompt ids the chat template gives `messages` with `options`,
  // plus `suffix` (a forced call's opening).
  std::vector<int64_t> Rendered(const std::vector<text::ChatMessage>& messages,
                                const text::ChatRenderOptions& options,
                                const std::string& suffix = "") {
    absl::StatusOr<const text::DeepSeekV4ChatTemplate*> tmpl =
        t_->codec->chat_template();
    absl::StatusOr<const text::Tokenizer*> tokenizer = t_->codec->tokenizer();
    EXPECT_TRUE(tmpl.ok() && tokenizer.ok());
    if (!tmpl.ok() || !tokenizer.ok()) return {};
    absl::StatusOr<std::string> prompt = (*tmpl)->Render(messages, options);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    if (!prompt.ok()) return {};
    absl::StatusOr<std::vector<int64_t>> ids =
        (*tokenizer)->Encode(*prompt + suffix, text::AddSpecialTokens::kNo);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int64_t>();
  }

  // The prompt the workers were given first.
  std::vector<int64_t> WorkerPrompt() {
    const std::vector<worker::v1::StepRequest> steps = t_->workers->steps();
    if (steps.empty() || steps[0].chunks_size() == 0) return {};
    return {steps[0].chunks(0).token_ids().begin(),
            steps[0].chunks(0).token_ids().end()};
  }

  std::string Decode(const std::vector<int64_t>& ids) {
    absl::StatusOr<const text::Tokenizer*> tokenizer = t_->codec->tokenizer();
    EXPECT_TRUE(tokenizer.ok());
    return tokenizer.ok()
               ? (*tokenizer)->Decode(ids, text::SkipSpecialTokens::kNo)
               : "";
  }
};

TEST_F(ServingChatTest, ChatStreamsTheAnswerAsContent) {
  const Outcome o =
      Generate(ChatRequestOf({Message(sv1::CHAT_ROLE_SYSTEM, "Be brief."),
                              Message(sv1::CHAT_ROLE_USER, "hello")},
                             5));
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens.size(), 5u);
  EXPECT_EQ(o.messages.back().finish_reason(), sv1::FINISH_REASON_LENGTH);
  // Thinking is off by default: the whole answer is content.
  EXPECT_EQ(o.text, Decode(o.tokens));
  EXPECT_FALSE(o.text.empty());
  EXPECT_EQ(o.reasoning, "");
  EXPECT_THAT(o.tool_calls, IsEmpty());
  // The workers saw the chat template's prompt.
  const text::ChatMessage system =
      TextMessage(text::ChatRole::kSystem, "Be brief.");
  const text::ChatMessage user = TextMessage(text::ChatRole::kUser, "hello");
  const std::vector<int64_t> expected = Rendered({system, user}, {});
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(WorkerPrompt(), expected);
  EXPECT_EQ(o.messages.back().prompt_tokens(),
            static_cast<int32_t>(expected.size()));
}

TEST_F(ServingChatTest, ThinkingStreamsReasoning) {
  sv1::GenerateRequest r =
      ChatRequestOf({Message(sv1::CHAT_ROLE_USER, "hello")}, 4);
  r.mutable_chat()->set_reasoning_effort("high");  // Turns thinking on.
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.reasoning, Decode(o.tokens));
  EXPECT_FALSE(o.reasoning.empty());
  EXPECT_EQ(o.text, "");
  text::ChatRenderOptions options;
  options.thinking = text::ThinkingMode::kThinking;
  options.reasoning_effort = "high";
  const text::ChatMessage user = TextMessage(text::ChatRole::kUser, "hello");
  EXPECT_EQ(WorkerPrompt(), Rendered({user}, options));

  // Thinking turned off explicitly wins over the effort.
  r.mutable_chat()->set_thinking(false);
  const Outcome off = Generate(r);
  ASSERT_TRUE(off.status.ok()) << off.status.error_message();
  EXPECT_EQ(off.reasoning, "");
  EXPECT_EQ(off.text, Decode(off.tokens));
}

TEST_F(ServingChatTest, NamedToolChoiceGivesAToolCall) {
  sv1::ChatMessage assistant = Message(sv1::CHAT_ROLE_ASSISTANT, "");
  sv1::ToolCall* call = assistant.add_tool_calls();
  call->set_id("c1");
  call->set_name("get_weather");
  call->set_arguments(R"({"city":"Oslo"})");
  sv1::ChatMessage result = Message(sv1::CHAT_ROLE_TOOL, "rain");
  result.set_tool_call_id("c1");
  sv1::GenerateRequest r =
      ChatRequestOf({Message(sv1::CHAT_ROLE_USER, "weather?"), assistant,
                     result, Message(sv1::CHAT_ROLE_USER, "and Bergen?")},
                    6);
  r.mutable_chat()->add_tool_functions(kWeatherTool);
  r.mutable_chat()->mutable_tool_choice()->set_mode(
      sv1::ToolChoice::MODE_NAMED);
  r.mutable_chat()->mutable_tool_choice()->set_name("get_weather");
  r.mutable_chat()->set_thinking(true);  // A forced call skips thinking.
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  std::string all;
  for (const sv1::GenerateResponse& m : o.messages) all += m.DebugString();
  EXPECT_EQ(o.messages.back().finish_reason(), sv1::FINISH_REASON_TOOL_CALLS)
      << all;
  ASSERT_FALSE(o.tool_calls.empty()) << all;
  EXPECT_EQ(o.tool_calls[0].index(), 0);
  EXPECT_EQ(o.tool_calls[0].name(), "get_weather");
  EXPECT_THAT(o.tool_calls[0].id(), ::testing::StartsWith("call_"));
  std::string arguments;
  for (const sv1::ToolCallDelta& c : o.tool_calls) {
    EXPECT_EQ(c.index(), 0) << all;
    arguments += c.arguments();
  }
  EXPECT_EQ(arguments, "{}") << all;
  EXPECT_EQ(o.reasoning, "");
  // The prompt holds the tool, the history and the call's opening.
  const std::string prompt = Decode(WorkerPrompt());
  EXPECT_THAT(prompt, HasSubstr("get_weather"));
  EXPECT_THAT(prompt, HasSubstr("Oslo"));
  EXPECT_THAT(prompt, ::testing::EndsWith("invoke name=\"get_weather\">\n"));
  EXPECT_THAT(prompt, ::testing::Not(::testing::EndsWith("<think>")));
}

TEST_F(ServingChatTest, SameChatSameIdsAsTheHttpFront) {
  // One conversation as a gRPC chat and as an OpenAI chat body.
  sv1::ChatMessage assistant = Message(sv1::CHAT_ROLE_ASSISTANT, "sunny");
  assistant.set_reasoning_content("think");
  sv1::GenerateRequest r = ChatRequestOf(
      {Message(sv1::CHAT_ROLE_SYSTEM, "sys"), Message(sv1::CHAT_ROLE_USER, "a"),
       assistant, Message(sv1::CHAT_ROLE_USER, "b")},
      2);
  r.mutable_chat()->add_tool_functions(kWeatherTool);
  r.mutable_chat()->set_reasoning_effort("max");
  const std::string body = std::string(R"({"messages": [)") +
                           R"({"role": "system", "content": "sys"},)" +
                           R"({"role": "user", "content": "a"},)" +
                           R"({"role": "assistant", "content": "sunny",)" +
                           R"( "reasoning_content": "think"},)" +
                           R"({"role": "user", "content": "b"}],)" +
                           R"("tools": [{"type": "function", "function": )" +
                           kWeatherTool + R"(}], "reasoning_effort": "max"})";
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  absl::StatusOr<const text::DeepSeekV4ChatTemplate*> tmpl =
      t_->codec->chat_template();
  absl::StatusOr<const text::Tokenizer*> tokenizer = t_->codec->tokenizer();
  ASSERT_TRUE(tmpl.ok() && tokenizer.ok());
  OpenAiRequest http;
  http.chat = true;
  const std::optional<HttpError> e =
      ParseChat(nlohmann::json::parse(body), **tmpl, **tokenizer,
                nlohmann::json::object(), body, http);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(http.prompts.size(), 1u);
  EXPECT_EQ(WorkerPrompt(), http.prompts[0]);
  EXPECT_THAT(Decode(WorkerPrompt()), HasSubstr("get_weather"));
}

TEST_F(ServingChatTest, ToolChoiceNoneDropsTheTools) {
  sv1::GenerateRequest r =
      ChatRequestOf({Message(sv1::CHAT_ROLE_USER, "hello")}, 3);
  r.mutable_chat()->add_tool_functions(kWeatherTool);
  r.mutable_chat()->mutable_tool_choice()->set_mode(sv1::ToolChoice::MODE_NONE);
  const Outcome o = Generate(r);
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.messages.back().finish_reason(), sv1::FINISH_REASON_LENGTH);
  EXPECT_THAT(Decode(WorkerPrompt()), ::testing::Not(HasSubstr("get_weather")));
  EXPECT_EQ(o.text, Decode(o.tokens));
}

TEST_F(ServingChatTest, InvalidChatsAreInvalidArgumentNamingTheField) {
  struct Case {
    sv1::GenerateRequest request;
    std::string field;
  };
  const sv1::ChatMessage user = Message(sv1::CHAT_ROLE_USER, "hi");
  std::vector<Case> cases;
  cases.push_back({ChatRequestOf({user}, 2), "'chat'"});
  cases.back().request.add_token_ids(5);
  cases.push_back({ChatRequestOf({user}, 2), "'chat'"});
  cases.back().request.set_prompt("hello");
  cases.push_back({ChatRequestOf({}, 2), "'chat.messages'"});
  cases.back().request.mutable_chat()->set_thinking(true);
  cases.push_back(
      {ChatRequestOf(std::vector<sv1::ChatMessage>(kMaxMessages + 1, user), 2),
       "'chat.messages'"});
  cases.push_back({ChatRequestOf({Message(sv1::CHAT_ROLE_UNSPECIFIED, "x")}, 2),
                   "'chat.messages[0].role'"});
  cases.push_back({ChatRequestOf({user, Message(sv1::CHAT_ROLE_TOOL, "r")}, 2),
                   "'chat.messages[1].tool_call_id'"});
  {
    sv1::ChatMessage a = Message(sv1::CHAT_ROLE_ASSISTANT, "");
    a.add_tool_calls()->set_name("f");
    a.mutable_tool_calls(0)->set_arguments("[1]");
    cases.push_back({ChatRequestOf({user, a, user}, 2),
                     "'chat.messages[1].tool_calls[0].arguments'"});
    a.mutable_tool_calls(0)->set_name("");
    a.mutable_tool_calls(0)->set_arguments("{}");
    cases.push_back({ChatRequestOf({user, a, user}, 2),
                     "'chat.messages[1].tool_calls[0].name'"});
    sv1::ChatMessage u = user;
    u.add_tool_calls()->set_name("f");
    cases.push_back({ChatRequestOf({u}, 2), "'chat.messages[0].tool_calls'"});
  }
  cases.push_back({ChatRequestOf({user}, 2), "'chat.tool_functions[0]'"});
  cases.back().request.mutable_chat()->add_tool_functions("{not json");
  cases.push_back({ChatRequestOf({user}, 2), "'chat.tool_functions[0].name'"});
  cases.back().request.mutable_chat()->add_tool_functions(R"({"a":1})");
  cases.push_back({ChatRequestOf({user}, 2), "'chat.tool_functions[1].name'"});
  cases.back().request.mutable_chat()->add_tool_functions(kWeatherTool);
  cases.back().request.mutable_chat()->add_tool_functions(kWeatherTool);
  cases.push_back({ChatRequestOf({user}, 2), "'chat.tool_choice.name'"});
  cases.back().request.mutable_chat()->add_tool_functions(kWeatherTool);
  cases.back().request.mutable_chat()->mutable_tool_choice()->set_mode(
      sv1::ToolChoice::MODE_NAMED);
  cases.back().request.mutable_chat()->mutable_tool_choice()->set_name("nope");
  cases.push_back({ChatRequestOf({user}, 2), "'chat.tool_choice.mode'"});
  cases.back().request.mutable_chat()->mutable_tool_choice()->set_mode(
      sv1::ToolChoice::MODE_REQUIRED);
  cases.push_back({ChatRequestOf({user}, 2), "'chat.reasoning_effort'"});
  cases.back().request.mutable_chat()->set_reasoning_effort("medium-ish");
  cases.push_back({ChatRequestOf({user}, 5000), "'chat.messages'"});
  for (const Case& c : cases) {
    const Outcome o = Generate(c.request);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << o.status.error_message();
    EXPECT_THAT(o.status.error_message(), HasSubstr(c.field));
    EXPECT_THAT(o.tokens, IsEmpty());
  }
  EXPECT_TRUE(t_->workers->steps().empty());
  EXPECT_TRUE(Generate(ChatRequestOf({user}, 1)).status.ok());
}

}  // namespace
}  // namespace mneme::coordinator
