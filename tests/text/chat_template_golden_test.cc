// The four golden renderings of DeepSeek's reference V4 encoder
// (testdata/dsv4_encoding/README.md), reproduced byte for byte.

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/text/test_tokenizers.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

using ordered_json = nlohmann::ordered_json;

struct GoldenCase {
  std::vector<ChatMessage> messages;
  ChatRenderOptions options;
};

std::string StringField(const ordered_json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

ChatRole RoleOf(const std::string& role) {
  if (role == "system") return ChatRole::kSystem;
  if (role == "assistant") return ChatRole::kAssistant;
  if (role == "tool") return ChatRole::kTool;
  if (role == "developer") return ChatRole::kDeveloper;
  if (role == "latest_reminder") return ChatRole::kLatestReminder;
  EXPECT_EQ(role, "user");
  return ChatRole::kUser;
}

ChatTask TaskOf(const std::string& task) {
  if (task.empty()) return ChatTask::kNone;
  if (task == "action") return ChatTask::kAction;
  if (task == "query") return ChatTask::kQuery;
  if (task == "authority") return ChatTask::kAuthority;
  if (task == "domain") return ChatTask::kDomain;
  if (task == "title") return ChatTask::kTitle;
  EXPECT_EQ(task, "read_url");
  return ChatTask::kReadUrl;
}

// An OpenAI-style case file as the reference test harness reads it: a list
// of messages, or {"tools", "messages"} with the tools on the first message.
// Tools on a message declare on that message.
GoldenCase ReadCase(const std::string& text, ThinkingMode thinking) {
  GoldenCase result;
  result.options.thinking = thinking;
  const ordered_json data = ordered_json::parse(text, nullptr, false);
  EXPECT_FALSE(data.is_discarded());
  const ordered_json& messages = data.is_array() ? data : data["messages"];
  const auto add_tools = [&](const ordered_json& tools, size_t index) {
    for (const ordered_json& tool : tools) {
      result.options.tool_functions.push_back(tool["function"].dump());
    }
    result.options.tools_message_index = index;
  };
  if (data.is_object() && data.contains("tools")) add_tools(data["tools"], 0);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    ChatMessage message;
    message.role = RoleOf(StringField(m, "role"));
    message.content = StringField(m, "content");
    message.reasoning_content = StringField(m, "reasoning_content");
    message.tool_call_id = StringField(m, "tool_call_id");
    message.task = TaskOf(StringField(m, "task"));
    if (m.contains("tool_calls")) {
      for (const ordered_json& call : m["tool_calls"]) {
        message.tool_calls.push_back(
            {StringField(call, "id"), StringField(call["function"], "name"),
             StringField(call["function"], "arguments")});
      }
    }
    if (m.contains("tools")) add_tools(m["tools"], i);
    result.messages.push_back(std::move(message));
  }
  return result;
}

struct GoldenParam {
  int number;
  ThinkingMode thinking;
  ChatFormat format;
};

class ChatTemplateGoldenTest : public ::testing::TestWithParam<GoldenParam> {};

TEST_P(ChatTemplateGoldenTest, RendersTheReferenceOutput) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("deepseek_style");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ChatTemplateOptions template_options;
  // The test tokenizer lacks <｜latest_reminder｜> and the task tokens.
  template_options.missing_special_tokens = MissingSpecialTokens::kRenderAsText;
  template_options.format = GetParam().format;
  absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> chat =
      DeepSeekV4ChatTemplate::Create(**tokenizer, template_options);
  ASSERT_TRUE(chat.ok()) << chat.status();

  const int n = GetParam().number;
  const GoldenCase golden = ReadCase(
      ReadTestdata(absl::StrCat("dsv4_encoding/test_input_", n, ".json")),
      GetParam().thinking);
  ASSERT_FALSE(golden.messages.empty());
  const std::string expected =
      ReadTestdata(absl::StrCat("dsv4_encoding/test_output_", n, ".txt"));
  ASSERT_FALSE(expected.empty());
  absl::StatusOr<std::string> prompt =
      (*chat)->Render(golden.messages, golden.options);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, expected);
}

// The 0731 revision changed only the effort texts: the default effort ("low")
// adds none, so its renderings are the preview's.
INSTANTIATE_TEST_SUITE_P(
    ReferenceCases, ChatTemplateGoldenTest,
    ::testing::Values(
        GoldenParam{1, ThinkingMode::kThinking, ChatFormat::kV4Preview},
        GoldenParam{2, ThinkingMode::kThinking, ChatFormat::kV4Preview},
        GoldenParam{3, ThinkingMode::kThinking, ChatFormat::kV4Preview},
        GoldenParam{4, ThinkingMode::kChat, ChatFormat::kV4Preview},
        GoldenParam{1, ThinkingMode::kThinking, ChatFormat::kV4_0731},
        GoldenParam{2, ThinkingMode::kThinking, ChatFormat::kV4_0731},
        GoldenParam{3, ThinkingMode::kThinking, ChatFormat::kV4_0731},
        GoldenParam{4, ThinkingMode::kChat, ChatFormat::kV4_0731}));

}  // namespace
}  // namespace mneme::text
