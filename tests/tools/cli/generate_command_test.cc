// `mneme generate` against an in-process Serving API over an engine with a
// fake worker group, and the chat file reader (tools/cli/chat_json.h).

#include "tools/cli/generate_command.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/inflight_gate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/server_runner.h"
#include "services/coordinator/serving_service.h"
#include "tests/services/coordinator/test_engine.h"
#include "tools/cli/chat_json.h"

namespace mneme::cli {
namespace {

namespace sv1 = ::mneme::serving::v1;
using ::mneme::coordinator::ServingService;
using ::mneme::coordinator::testing::TestEngine;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kChat[] = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "weather "},
                                 {"type": "text", "text": "in Oslo?"}]},
    {"role": "assistant", "content": null, "reasoning_content": "look it up",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    {"role": "user", "content": "and Bergen?"}
  ],
  "tools": [{"type": "function",
             "function": {"name": "get_weather", "description": "d",
                          "parameters": {"type": "object", "properties":
                              {"city": {"type": "string"}}}}}],
  "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
  "chat_template_kwargs": {"thinking": false},
  "reasoning_effort": "high"
})";

TEST(ChatJsonTest, ReadsTheOpenAiShape) {
  absl::StatusOr<sv1::Chat> chat = ChatFromOpenAiJson(kChat);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_EQ(chat->messages_size(), 5);
  EXPECT_EQ(chat->messages(0).role(), sv1::CHAT_ROLE_SYSTEM);
  EXPECT_EQ(chat->messages(1).content(), "weather in Oslo?");
  EXPECT_EQ(chat->messages(2).role(), sv1::CHAT_ROLE_ASSISTANT);
  EXPECT_EQ(chat->messages(2).reasoning_content(), "look it up");
  ASSERT_EQ(chat->messages(2).tool_calls_size(), 1);
  EXPECT_EQ(chat->messages(2).tool_calls(0).id(), "c1");
  EXPECT_EQ(chat->messages(2).tool_calls(0).name(), "get_weather");
  EXPECT_EQ(chat->messages(2).tool_calls(0).arguments(), R"({"city":"Oslo"})");
  EXPECT_EQ(chat->messages(3).role(), sv1::CHAT_ROLE_TOOL);
  EXPECT_EQ(chat->messages(3).tool_call_id(), "c1");
  ASSERT_EQ(chat->tool_functions_size(), 1);
  // The function object keeps its key order.
  EXPECT_EQ(chat->tool_functions(0),
            R"({"name":"get_weather","description":"d","parameters":)"
            R"({"type":"object","properties":{"city":{"type":"string"}}}})");
  EXPECT_EQ(chat->tool_choice().mode(), sv1::ToolChoice::MODE_NAMED);
  EXPECT_EQ(chat->tool_choice().name(), "get_weather");
  ASSERT_TRUE(chat->has_thinking());
  EXPECT_FALSE(chat->thinking());
  EXPECT_EQ(chat->reasoning_effort(), "high");

  // A bare list of messages; unset reasoning settings stay unset.
  chat = ChatFromOpenAiJson(R"([{"role": "user", "content": "hi"}])");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->messages_size(), 1);
  EXPECT_FALSE(chat->has_thinking());
  EXPECT_FALSE(chat->has_reasoning_effort());
}

TEST(ChatJsonTest, ErrorsNameThePath) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not valid JSON"},
      {"{}", "'messages'"},
      {R"({"messages": 3})", "'messages'"},
      {R"([{"role": "robot"}])", "'messages[0].role'"},
      {R"([{"content": "x"}])", "'messages[0].role'"},
      {R"([{"role": "user", "content": 3}])", "'messages[0].content'"},
      {R"([{"role": "user", "content": [{"type": "image"}]}])",
       "'messages[0].content[0]'"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f",
          "arguments": 3}}]}])",
       "'messages[0].tool_calls[0].function.arguments'"},
      {R"([{"role": "tool", "tool_call_id": 5}])",
       "'messages[0].tool_call_id'"},
      {R"({"messages": [], "tools": [{"type": "function"}]})", "'tools[0]'"},
      {R"({"messages": [], "tool_choice": "maybe"})", "'tool_choice'"},
      {R"({"messages": [], "reasoning_effort": 1.5})", "'reasoning_effort'"},
      {R"({"messages": [], "thinking": "yes"})", "'thinking'"},
  };
  for (const auto& [text, field] : cases) {
    absl::StatusOr<sv1::Chat> chat = ChatFromOpenAiJson(text);
    ASSERT_FALSE(chat.ok()) << text;
    EXPECT_EQ(chat.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(chat.status().message(), HasSubstr(field)) << text;
  }
}

class GenerateCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Chat prompts with a tool's schema are longer than 256 tokens.
    absl::StatusOr<std::unique_ptr<TestEngine>> t =
        TestEngine::Create({}, 4096);
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *std::move(t);
    absl::StatusOr<std::unique_ptr<ServingService>> service =
        ServingService::Create(t_->engine.get(), &gate_, t_->codec.get());
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    absl::StatusOr<std::unique_ptr<ServerRunner>> runner =
        ServerRunner::Create(ServerOptions(), {service_.get()}, &gate_);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  void TearDown() override {
    if (runner_ != nullptr) runner_->Drain();
    if (t_ != nullptr) t_->engine->Stop();
  }

  std::string WriteChat(const std::string& text) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string path =
        std::string(tmp != nullptr ? tmp : "/tmp") + "/chat.json";
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }

  absl::Status Run(std::vector<std::string> argv, std::string& out) {
    argv.insert(argv.begin(), {"--server", runner_->address().ToString()});
    std::ostringstream stream;
    absl::Status st = RunGenerate(argv, stream);
    out = stream.str();
    return st;
  }

  InflightGate gate_;
  std::unique_ptr<TestEngine> t_;
  std::unique_ptr<ServingService> service_;
  std::unique_ptr<ServerRunner> runner_;
};

TEST_F(GenerateCommandTest, ChatWithANamedToolPrintsTheCall) {
  const std::string path = WriteChat(kChat);
  std::string out;
  absl::Status st = Run(
      {"--chat-json", path, "--max-new-tokens", "4", "--ignore-eos", "--json"},
      out);
  ASSERT_TRUE(st.ok()) << st;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["finish_reason"], "tool_calls") << out;
  EXPECT_EQ(j["token_ids"].size(), 4u) << out;
  EXPECT_EQ(j["reasoning_content"], "") << out;
  ASSERT_EQ(j["tool_calls"].size(), 1u) << out;
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "get_weather") << out;
  EXPECT_EQ(j["tool_calls"][0]["function"]["arguments"], "{}") << out;
  EXPECT_THAT(j["tool_calls"][0]["id"].get<std::string>(), StartsWith("call_"));

  st = Run({"--chat-json", path, "--max-new-tokens", "4", "--ignore-eos"}, out);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_THAT(out, HasSubstr("[tool_call call_"));
  EXPECT_THAT(out, HasSubstr("] get_weather {}\n"));
  EXPECT_THAT(out, HasSubstr("finish_reason: tool_calls\n"));
}

TEST_F(GenerateCommandTest, ChatPrintsReasoningThenContent) {
  const std::string path = WriteChat(
      R"({"messages": [{"role": "user", "content": "hi"}],
          "reasoning_effort": "max"})");
  std::string out;
  absl::Status st =
      Run({"--chat-json", path, "--max-new-tokens", "3", "--ignore-eos"}, out);
  ASSERT_TRUE(st.ok()) << st;
  // Thinking: the whole (short) answer is reasoning.
  EXPECT_THAT(out, StartsWith("[reasoning]\n")) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("[content]"))) << out;
  EXPECT_THAT(out, HasSubstr("finish_reason: length\n")) << out;
  st = Run({"--chat-json", path, "--json"}, out);
  ASSERT_TRUE(st.ok()) << st;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_NE(j["reasoning_content"], "") << out;
  EXPECT_EQ(j["tool_calls"].size(), 0u) << out;
}

TEST_F(GenerateCommandTest, BadChatsAreErrors) {
  std::string out;
  // Two prompt forms.
  EXPECT_EQ(Run({"--chat-json", WriteChat("[]"), "--prompt", "x"}, out).code(),
            absl::StatusCode::kInvalidArgument);
  // A file the reader refuses names the file and the path.
  absl::Status st = Run({"--chat-json", WriteChat("[{\"role\": 1}]")}, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("'messages[0].role'"));
  // The server's refusal (an empty chat) comes back with its field.
  st = Run({"--chat-json", WriteChat("[]")}, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("chat.messages"));
  st = Run({"--chat-json", "/nonexistent/chat.json"}, out);
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace mneme::cli
