// DeepSeekV4ChatTemplate beyond plain chat: tools and DSML tool calls, tool
// results, developer / latest_reminder / task messages, the reasoning effort
// of each format revision, DeepSeek-V4.1, format detection and bad input.
// Expected prompts follow DeepSeek's reference encoders (encoding_dsv4.py,
// the V4.1 encoder and its SGLang tests).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/text/test_tokenizers.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kEos[] = "<｜end▁of▁sentence｜>";
constexpr char kUser[] = "<｜User｜>";
constexpr char kAssistant[] = "<｜Assistant｜>";
constexpr char kSystem[] = "<｜System｜>";
constexpr char kReminder[] = "<｜latest_reminder｜>";

// The effort texts as DeepSeek's encoders write them (encoding_dsv4.py
// REASONING_EFFORT_MAX; the 0731 "max" text; V4.1's template).
constexpr char kAbsoluteMaximum[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose "
    "the problem to resolve the root cause, rigorously stress-testing your "
    "logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every "
    "intermediate step, considered alternative, and rejected hypothesis to "
    "ensure absolutely no assumption is left unchecked.\n\n";
constexpr char kBeyondMaximum[] =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and "
    "uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely "
    "nothing to chance: exhaustively decompose the problem into its most "
    "fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution "
    "from multiple angles and are certain that no assumption remains "
    "unchecked and no error remains undiscovered.\n\n";

std::string V41Effort(int budget) {
  return absl::StrCat(kSystem, "Reasoning Effort: ", budget,
                      " (range 1-100, the higher the value, the more thorough "
                      "the reasoning)\n\n");
}

ChatMessage Message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}
ChatMessage System(std::string c) {
  return Message(ChatRole::kSystem, std::move(c));
}
ChatMessage User(std::string c) {
  return Message(ChatRole::kUser, std::move(c));
}
ChatMessage Developer(std::string c) {
  return Message(ChatRole::kDeveloper, std::move(c));
}
ChatMessage Reminder(std::string c) {
  return Message(ChatRole::kLatestReminder, std::move(c));
}
ChatMessage Assistant(std::string content, std::string reasoning = "",
                      std::vector<ToolCall> calls = {}) {
  ChatMessage m = Message(ChatRole::kAssistant, std::move(content));
  m.reasoning_content = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}
ChatMessage Tool(std::string id, std::string content) {
  ChatMessage m = Message(ChatRole::kTool, std::move(content));
  m.tool_call_id = std::move(id);
  return m;
}

ChatRenderOptions Thinking(std::string effort = "") {
  ChatRenderOptions options;
  options.thinking = ThinkingMode::kThinking;
  options.reasoning_effort = std::move(effort);
  return options;
}

constexpr char kLookup[] =
    R"({"name":"lookup","description":"Look up a value","parameters":)"
    R"({"type":"object","properties":{"query":{"type":"string"},)"
    R"("limit":{"type":"integer"}}}})";
constexpr char kLookupPython[] =
    R"({"name": "lookup", "description": "Look up a value", "parameters": )"
    R"({"type": "object", "properties": {"query": {"type": "string"}, )"
    R"("limit": {"type": "integer"}}}})";

class FormatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        LoadTestTokenizer("deepseek_style");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    for (const ChatFormat format :
         {ChatFormat::kV4Preview, ChatFormat::kV4_0731, ChatFormat::kV41}) {
      ChatTemplateOptions options;
      // The test tokenizer lacks <｜System｜>, <｜latest_reminder｜> and the
      // task tokens.
      options.missing_special_tokens = MissingSpecialTokens::kRenderAsText;
      options.format = format;
      absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> chat =
          DeepSeekV4ChatTemplate::Create(*tokenizer_, options);
      ASSERT_TRUE(chat.ok()) << chat.status();
      chats_.push_back(*std::move(chat));
    }
  }

  const DeepSeekV4ChatTemplate& Chat(ChatFormat format) {
    return *chats_[static_cast<int>(format)];
  }

  std::string Render(ChatFormat format, const std::vector<ChatMessage>& m,
                     const ChatRenderOptions& options) {
    absl::StatusOr<std::string> prompt = Chat(format).Render(m, options);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    return prompt.ok() ? *prompt : "<error>";
  }
  std::string V4(const std::vector<ChatMessage>& m,
                 const ChatRenderOptions& options) {
    return Render(ChatFormat::kV4_0731, m, options);
  }
  std::string V41(const std::vector<ChatMessage>& m,
                  const ChatRenderOptions& options) {
    return Render(ChatFormat::kV41, m, options);
  }

  absl::Status Error(const std::vector<ChatMessage>& m,
                     const ChatRenderOptions& options,
                     ChatFormat format = ChatFormat::kV4_0731) {
    return Chat(format).Render(m, options).status();
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<DeepSeekV4ChatTemplate>> chats_;
};

// --- Tools -----------------------------------------------------------------

TEST_F(FormatsTest, ToolsFollowTheLeadingSystemMessage) {
  ChatRenderOptions options;
  options.tool_functions = {kLookup};
  const std::string prompt = V4({System("sys"), User("q")}, options);
  EXPECT_THAT(prompt, StartsWith(absl::StrCat(kBos, "sys\n\n## Tools\n\n")));
  EXPECT_THAT(prompt, HasSubstr(absl::StrCat("### Available Tool Schemas\n\n",
                                             kLookupPython,
                                             "\n\nYou MUST strictly follow")));
  EXPECT_THAT(prompt, HasSubstr(absl::StrCat("to invoke tool calls.\n", kUser,
                                             "q", kAssistant, "</think>")));
}

TEST_F(FormatsTest, WithoutASystemMessageToolsGetAnEmptyOne) {
  ChatRenderOptions options;
  options.tool_functions = {kLookup};
  EXPECT_THAT(V4({User("q")}, options),
              StartsWith(absl::StrCat(kBos, "\n\n## Tools\n\n")));
  // A later system message does not declare them on V4.
  const std::string later = V4({User("q"), System("s")}, options);
  EXPECT_THAT(later, StartsWith(absl::StrCat(kBos, "\n\n## Tools\n\n")));
  EXPECT_THAT(later, HasSubstr(absl::StrCat(kUser, "qs")));
  // A leading developer message declares them.
  EXPECT_THAT(V4({Developer("dev"), User("q")}, options),
              StartsWith(absl::StrCat(kBos, kUser, "dev\n\n## Tools\n\n")));
  // V4.1: the first system message anywhere.
  const std::string v41 = V41({User("q"), System("s")}, options);
  EXPECT_THAT(v41, StartsWith(absl::StrCat(kBos, kUser, "q", kSystem,
                                           "s\n\n## Tools\n\n")));
  EXPECT_THAT(V41({User("q")}, options),
              StartsWith(absl::StrCat(kBos, kSystem, "\n\n## Tools\n\n")));
}

TEST_F(FormatsTest, SchemasKeepKeyOrderAndUnicode) {
  ChatRenderOptions options;
  options.tool_functions = {
      R"({"name":"z","parameters":{"b":1.0,"a":[true,null]},"d":"天气 \"x\""})",
      R"({"name":"y"})"};
  EXPECT_THAT(
      V4({System("")}, options),
      HasSubstr("### Available Tool Schemas\n\n"
                R"({"name": "z", "parameters": {"b": 1.0, "a": [true, null]}, )"
                R"("d": "天气 \"x\""})"
                "\n"
                R"({"name": "y"})"
                "\n\nYou MUST"));
}

TEST_F(FormatsTest, ResponseFormatFollowsTheTools) {
  ChatRenderOptions options;
  options.tool_functions = {kLookup};
  options.response_format = R"({"type":"object","properties":{"x":{}}})";
  EXPECT_THAT(
      V4({System("sys"), User("q")}, options),
      HasSubstr(absl::StrCat(
          "to invoke tool calls.\n\n\n## Response Format:\n\nYou MUST strictly "
          "adhere to the following schema to reply:\n",
          R"({"type": "object", "properties": {"x": {}}})", kUser, "q")));
  // Alone, it does not keep earlier reasoning (only tools do).
  ChatRenderOptions alone = Thinking();
  alone.response_format = R"({"type":"object"})";
  EXPECT_EQ(V4({System("s"), User("a"), Assistant("b", "r"), User("c")}, alone),
            absl::StrCat(kBos,
                         "s\n\n## Response Format:\n\nYou MUST strictly "
                         "adhere to the following schema to reply:\n"
                         R"({"type": "object"})",
                         kUser, "a", kAssistant, "</think>b", kEos, kUser, "c",
                         kAssistant, "<think>"));
}

TEST_F(FormatsTest, ToolsKeepEveryTurnsReasoning) {
  const std::vector<ChatMessage> messages = {System("s"), User("a"),
                                             Assistant("b", "r1"), User("c")};
  ChatRenderOptions options = Thinking();
  options.tool_functions = {kLookup};
  EXPECT_THAT(
      V4(messages, options),
      HasSubstr(absl::StrCat(kUser, "a", kAssistant, "<think>r1</think>b", kEos,
                             kUser, "c", kAssistant, "<think>")));
  EXPECT_THAT(V4(messages, Thinking()),
              HasSubstr(absl::StrCat(kUser, "a", kAssistant, "</think>b", kEos,
                                     kUser, "c", kAssistant, "<think>")));
}

// The V4.1 tools block is V4's with the spaced tag names.
TEST_F(FormatsTest, V41ToolsTemplateUsesSpacedTags) {
  const std::string golden = ReadTestdata("dsv4_encoding/test_output_1.txt");
  const size_t begin = golden.find("## Tools");
  const size_t end = golden.find(kUser);
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const std::string v4_block = golden.substr(begin, end - begin);
  const std::string v41_block = absl::StrReplaceAll(
      v4_block, {{"｜DSML｜tool_calls", "｜DSML｜ calls"},
                 {"｜DSML｜invoke", "｜DSML｜ invoke"},
                 {"｜DSML｜parameter", "｜DSML｜ parameter"}});
  ASSERT_NE(v41_block, v4_block);
  ChatRenderOptions options;
  options.tool_functions = {
      R"({"name": "get_weather", "description": "Get the weather for a specific location", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}}, "required": ["location"]}})",
      R"({"name": "search", "description": "Search the web for information", "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Search query"}, "num_results": {"type": "integer", "description": "Number of results to return"}}, "required": ["query"]}})"};
  EXPECT_EQ(V4({System("x"), User("q")}, options),
            absl::StrCat(kBos, "x\n\n", v4_block, kUser, "q", kAssistant,
                         "</think>"));
  EXPECT_EQ(V41({System("x"), User("q")}, options),
            absl::StrCat(kBos, kSystem, "x\n\n", v41_block, kUser, "q",
                         kAssistant, "</think>"));
}

// --- DSML tool calls ---------------------------------------------------------

TEST_F(FormatsTest, AssistantToolCallsAsDsml) {
  const std::vector<ChatMessage> messages = {
      User("question"),
      Assistant("summary", "  reason  ",
                {{"c1", "lookup",
                  R"({"query":"va\"l<ue>","limit":2,"f":1.50,"ok":true,)"
                  R"("none":null,"list":[1,"天"],"obj":{"b":1,"a":2}})"},
                 {"c2", "other", "{}"}})};
  const std::string calls_v4 = absl::StrCat(
      "summary\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"lookup\">\n"
      "<｜DSML｜parameter name=\"query\" "
      "string=\"true\">va\"l<ue></｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"limit\" "
      "string=\"false\">2</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"f\" string=\"false\">1.5</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"ok\" "
      "string=\"false\">true</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"none\" "
      "string=\"false\">null</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"list\" string=\"false\">[1, "
      "\"天\"]</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"obj\" string=\"false\">{\"b\": 1, \"a\": "
      "2}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"other\">\n\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>",
      kEos);
  EXPECT_EQ(V4(messages, Thinking()),
            absl::StrCat(kBos, kUser, "question", kAssistant,
                         "<think>  reason  </think>", calls_v4));
  const std::string calls_v41 = absl::StrReplaceAll(
      calls_v4, {{"｜DSML｜tool_calls", "｜DSML｜ calls"},
                 {"｜DSML｜invoke", "｜DSML｜ invoke"},
                 {"｜DSML｜parameter", "｜DSML｜ parameter"}});
  EXPECT_EQ(V41(messages, Thinking()),
            absl::StrCat(kBos, V41Effort(75), kUser, "question", kAssistant,
                         "<think>  reason  </think>", calls_v41));
}

// SGLang's V4.1 test_assistant_tool_call_renders_spaced_tags.
TEST_F(FormatsTest, V41ToolCallCompletion) {
  const std::string completion =
      "  reason  </think>summary\n\n"
      "<｜DSML｜ calls>\n"
      "<｜DSML｜ invoke name=\"lookup\">\n"
      "<｜DSML｜ parameter name=\"query\" string=\"true\">value</｜DSML｜ "
      "parameter>\n"
      "<｜DSML｜ parameter name=\"limit\" string=\"false\">2</｜DSML｜ "
      "parameter>\n"
      "</｜DSML｜ invoke>\n"
      "</｜DSML｜ calls><｜end▁of▁sentence｜>";
  const std::string prompt =
      V41({User("question"),
           Assistant("summary", "  reason  ",
                     {{"", "lookup", R"({"query":"value","limit":2})"}})},
          Thinking());
  EXPECT_EQ(prompt, absl::StrCat(kBos, V41Effort(75), kUser, "question",
                                 kAssistant, "<think>", completion));
}

// --- Tool results ------------------------------------------------------------

// SGLang's V4.1 test_multiturn_prompt_preserves_reasoning_and_tool_results.
TEST_F(FormatsTest, ToolResultsFollowTheCallOrder) {
  std::vector<ChatMessage> messages = {
      System("system"), User("question"),
      Assistant("summary", "reason",
                {{"a", "lookup", R"({"query":"first"})"},
                 {"b", "lookup", R"({"query":"second"})"}}),
      Tool("b", "second result"), Tool("a", "first result")};
  ChatRenderOptions options = Thinking();
  options.tool_functions = {kLookup};
  const std::string prompt = V41(messages, options);
  const std::string expected =
      "<｜User｜>question<｜Assistant｜><think>reason</think>summary\n\n"
      "<｜DSML｜ calls>\n"
      "<｜DSML｜ invoke name=\"lookup\">\n"
      "<｜DSML｜ parameter name=\"query\" string=\"true\">first</｜DSML｜ "
      "parameter>\n"
      "</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"lookup\">\n"
      "<｜DSML｜ parameter name=\"query\" string=\"true\">second</｜DSML｜ "
      "parameter>\n"
      "</｜DSML｜ invoke>\n"
      "</｜DSML｜ calls><｜end▁of▁sentence｜>"
      "<｜User｜><tool_result>first result</tool_result>\n\n"
      "<tool_result>second result</tool_result><｜Assistant｜><think>";
  ASSERT_NE(prompt.find(kUser), std::string::npos);
  EXPECT_EQ(prompt.substr(prompt.find(kUser)), expected);
  EXPECT_THAT(prompt, StartsWith(absl::StrCat(kBos, V41Effort(75),
                                              "system\n\n## Tools")));

  // A user message after the results joins their turn; the next assistant
  // message's calls order the next results.
  messages.push_back(User("and?"));
  messages.push_back(Assistant(
      "", "",
      {{"x", "lookup", "{}"}, {"y", "lookup", "{}"}, {"z", "lookup", "{}"}}));
  messages.push_back(Tool("z", "Z"));
  messages.push_back(Tool("x", "X"));
  messages.push_back(Tool("y", "Y"));
  const std::string longer = V4(messages, ChatRenderOptions());
  EXPECT_THAT(longer,
              HasSubstr("<tool_result>first result</tool_result>\n\n"
                        "<tool_result>second result</tool_result>\n\nand?"
                        "<｜Assistant｜></think>"));
  EXPECT_THAT(longer, HasSubstr("<｜User｜><tool_result>X</tool_result>\n\n"
                                "<tool_result>Y</tool_result>\n\n<tool_result>Z"
                                "</tool_result><｜Assistant｜></think>"));
}

TEST_F(FormatsTest, ConsecutiveUserMessagesMerge) {
  EXPECT_EQ(V4({User("a"), User("b"), Assistant("c")}, ChatRenderOptions()),
            absl::StrCat(kBos, kUser, "a\n\nb", kAssistant, "</think>c", kEos));
}

// --- Developer, latest_reminder, tasks ------------------------------------

TEST_F(FormatsTest, DeveloperAndReminderMessages) {
  // A reminder after a user turn opens the answer before it.
  EXPECT_EQ(V4({System("s"), Reminder("2026-02-21"), User("q"), Reminder("r")},
               Thinking()),
            absl::StrCat(kBos, "s", kReminder, "2026-02-21", kUser, "q",
                         kAssistant, "<think>", kReminder, "r"));
  // Thinking without tools drops developer messages before the last user
  // turn and the reasoning of earlier answers; chat mode keeps them.
  const std::vector<ChatMessage> messages = {
      Developer("d1"), Assistant("a", "r"), User("u"), Developer("d2")};
  EXPECT_EQ(V4(messages, Thinking()),
            absl::StrCat(kBos, "a", kEos, kUser, "u", kUser, "d2", kAssistant,
                         "<think>"));
  EXPECT_EQ(V4(messages, ChatRenderOptions()),
            absl::StrCat(kBos, kUser, "d1", kAssistant, "</think>a", kEos,
                         kUser, "u", kUser, "d2", kAssistant, "</think>"));
}

TEST_F(FormatsTest, TaskTokens) {
  ChatMessage query = User("classify me");
  query.task = ChatTask::kQuery;
  const std::string prompt = V41({query}, ChatRenderOptions());
  EXPECT_EQ(prompt, absl::StrCat(kBos, kUser, "classify me<｜query｜>"));
  ChatMessage action = User("q");
  action.task = ChatTask::kAction;
  // A user message after one with a task starts a new turn.
  EXPECT_EQ(
      V4({action, User("next")}, ChatRenderOptions()),
      absl::StrCat(kBos, kUser, "q", kUser, "next", kAssistant, "</think>"));
  // The answer to a task has no reasoning part.
  EXPECT_EQ(V4({action, Assistant("Search", "r")}, Thinking()),
            absl::StrCat(kBos, kUser, "q", kAssistant, "<think><｜action｜>",
                         "Search", kEos));
}

// --- Reasoning effort --------------------------------------------------------

TEST_F(FormatsTest, V4EffortLadders) {
  const std::vector<ChatMessage> messages = {System("s"), User("q")};
  const std::string tail = absl::StrCat("s", kUser, "q", kAssistant, "<think>");
  EXPECT_EQ(Render(ChatFormat::kV4Preview, messages, Thinking()),
            absl::StrCat(kBos, tail));
  EXPECT_EQ(Render(ChatFormat::kV4Preview, messages, Thinking("high")),
            absl::StrCat(kBos, tail));
  EXPECT_EQ(Render(ChatFormat::kV4Preview, messages, Thinking("max")),
            absl::StrCat(kBos, kAbsoluteMaximum, tail));
  EXPECT_EQ(Render(ChatFormat::kV4_0731, messages, Thinking()),
            absl::StrCat(kBos, tail));
  EXPECT_EQ(Render(ChatFormat::kV4_0731, messages, Thinking("low")),
            absl::StrCat(kBos, tail));
  EXPECT_EQ(Render(ChatFormat::kV4_0731, messages, Thinking("high")),
            absl::StrCat(kBos, kAbsoluteMaximum, tail));
  EXPECT_EQ(Render(ChatFormat::kV4_0731, messages, Thinking("max")),
            absl::StrCat(kBos, kBeyondMaximum, tail));
  // Before a first user message too, and never in chat mode.
  EXPECT_EQ(
      Render(ChatFormat::kV4_0731, {User("q")}, Thinking("max")),
      absl::StrCat(kBos, kBeyondMaximum, kUser, "q", kAssistant, "<think>"));
  ChatRenderOptions chat;
  chat.reasoning_effort = "max";
  EXPECT_EQ(Render(ChatFormat::kV4_0731, messages, chat),
            absl::StrCat(kBos, "s", kUser, "q", kAssistant, "</think>"));
  EXPECT_EQ(Error(messages, Thinking("low"), ChatFormat::kV4Preview).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Error(messages, Thinking("75")).code(),
            absl::StatusCode::kInvalidArgument);
}

// SGLang's V4.1 tests, with the released budgets (low 50, high 75, max 100).
TEST_F(FormatsTest, V41EffortBudgets) {
  for (const auto& [effort, budget] :
       std::vector<std::pair<std::string, int>>{{"", 75},
                                                {"low", 50},
                                                {"high", 75},
                                                {"max", 100},
                                                {"1", 1},
                                                {"42", 42},
                                                {"100", 100}}) {
    EXPECT_EQ(V41({User("question")}, Thinking(effort)),
              absl::StrCat(kBos, V41Effort(budget), kUser, "question",
                           kAssistant, "<think>"))
        << effort;
  }
  for (const std::string bad : {"0", "101", "-1", "medium", "minimal", "none",
                                "xhigh", "1.5", "075", " 5"}) {
    EXPECT_EQ(Error({User("q")}, Thinking(bad), ChatFormat::kV41).code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  ChatRenderOptions chat;
  chat.reasoning_effort = "max";
  EXPECT_EQ(V41({User("hello")}, chat),
            absl::StrCat(kBos, kUser, "hello", kAssistant, "</think>"));
}

TEST(NormalizeReasoningEffortTest, PerFormatRules) {
  struct Case {
    ChatFormat format;
    std::optional<std::string> effort;
    ThinkingMode thinking;
    std::string rendered;
  };
  const std::vector<Case> cases = {
      {ChatFormat::kV4Preview, std::nullopt, ThinkingMode::kThinking, "high"},
      {ChatFormat::kV4Preview, "none", ThinkingMode::kChat, ""},
      {ChatFormat::kV4Preview, "high", ThinkingMode::kThinking, "high"},
      {ChatFormat::kV4Preview, "max", ThinkingMode::kThinking, "max"},
      {ChatFormat::kV4_0731, std::nullopt, ThinkingMode::kThinking, "low"},
      {ChatFormat::kV4_0731, "none", ThinkingMode::kChat, ""},
      {ChatFormat::kV4_0731, "low", ThinkingMode::kThinking, "low"},
      {ChatFormat::kV4_0731, "high", ThinkingMode::kThinking, "high"},
      {ChatFormat::kV4_0731, "max", ThinkingMode::kThinking, "max"},
      {ChatFormat::kV41, std::nullopt, ThinkingMode::kThinking, "75"},
      {ChatFormat::kV41, "none", ThinkingMode::kChat, ""},
      {ChatFormat::kV41, "low", ThinkingMode::kThinking, "50"},
      {ChatFormat::kV41, "high", ThinkingMode::kThinking, "75"},
      {ChatFormat::kV41, "max", ThinkingMode::kThinking, "100"},
      {ChatFormat::kV41, "1", ThinkingMode::kThinking, "1"},
      {ChatFormat::kV41, "99", ThinkingMode::kThinking, "99"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<EffortChoice> choice =
        NormalizeReasoningEffort(c.format, c.effort);
    ASSERT_TRUE(choice.ok()) << c.effort.value_or("(none)") << choice.status();
    EXPECT_EQ(choice->thinking, c.thinking) << c.effort.value_or("(none)");
    EXPECT_EQ(choice->reasoning_effort, c.rendered)
        << c.effort.value_or("(none)");
  }
  const std::vector<std::pair<ChatFormat, std::string>> rejected = {
      {ChatFormat::kV4Preview, "low"},  {ChatFormat::kV4Preview, "medium"},
      {ChatFormat::kV4Preview, "50"},   {ChatFormat::kV4_0731, "minimal"},
      {ChatFormat::kV4_0731, "medium"}, {ChatFormat::kV4_0731, "xhigh"},
      {ChatFormat::kV4_0731, "HIGH"},   {ChatFormat::kV41, "minimal"},
      {ChatFormat::kV41, "medium"},     {ChatFormat::kV41, "0"},
      {ChatFormat::kV41, "101"},        {ChatFormat::kV41, ""},
  };
  for (const auto& [format, effort] : rejected) {
    const absl::Status status =
        NormalizeReasoningEffort(format, effort).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << effort;
    EXPECT_THAT(status.message(), HasSubstr(effort)) << effort;
  }
}

// --- DeepSeek-V4.1 -----------------------------------------------------------

TEST_F(FormatsTest, V41SystemToken) {
  EXPECT_EQ(V41({System("You are a helpful assistant."), User("hello")},
                ChatRenderOptions()),
            absl::StrCat(kBos, kSystem, "You are a helpful assistant.", kUser,
                         "hello", kAssistant, "</think>"));
  // An empty system message still writes the token in chat mode; in
  // thinking mode the effort line writes it anyway.
  EXPECT_EQ(V41({System(""), User("hi")}, ChatRenderOptions()),
            absl::StrCat(kBos, kSystem, kUser, "hi", kAssistant, "</think>"));
  EXPECT_EQ(V41({System(""), User("hi")}, Thinking()),
            V41({User("hi")}, Thinking()));
  // A later system message counts as a user turn.
  EXPECT_EQ(
      V41({System("sys"), User("q1"), Assistant("a1", "r1"), System("mid sys")},
          Thinking("88")),
      absl::StrCat(kBos, V41Effort(88), "sys", kUser, "q1", kAssistant,
                   "</think>a1", kEos, kSystem, "mid sys", kAssistant,
                   "<think>"));
  // Plain chat without a system message is V4's.
  const std::vector<ChatMessage> plain = {User("1+1=?"), Assistant("2", "r"),
                                          User("2+2=?")};
  EXPECT_EQ(V41(plain, ChatRenderOptions()), V4(plain, ChatRenderOptions()));
}

TEST_F(FormatsTest, V41ContinuesReasoningOnlyPrefill) {
  ChatRenderOptions options = Thinking();
  options.final_assistant = FinalAssistantMessage::kContinue;
  EXPECT_EQ(V41({User("q"), Assistant("", "Let me")}, options),
            absl::StrCat(kBos, V41Effort(75), kUser, "q", kAssistant,
                         "<think>Let me"));
  EXPECT_EQ(V4({User("q"), Assistant("The", "r")}, options),
            absl::StrCat(kBos, kUser, "q", kAssistant, "<think>r</think>The"));
}

TEST_F(FormatsTest, V41NeedsTheSystemTokenUnlessRenderedAsText) {
  ChatTemplateOptions options;
  options.format = ChatFormat::kV41;
  const absl::Status status =
      DeepSeekV4ChatTemplate::Create(*tokenizer_, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(kSystem));
  options.format = ChatFormat::kV4_0731;
  absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> strict =
      DeepSeekV4ChatTemplate::Create(*tokenizer_, options);
  ASSERT_TRUE(strict.ok()) << strict.status();
  EXPECT_EQ((*strict)->format(), ChatFormat::kV4_0731);
  // Optional tokens are checked when used.
  EXPECT_TRUE((*strict)->Render({User("q")}, ChatRenderOptions()).ok());
  const absl::Status reminder =
      (*strict)
          ->Render({Reminder("r"), User("q")}, ChatRenderOptions())
          .status();
  EXPECT_EQ(reminder.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reminder.message(), HasSubstr(kReminder));
  ChatMessage task = User("q");
  task.task = ChatTask::kTitle;
  EXPECT_THAT((*strict)->Render({task}, ChatRenderOptions()).status().message(),
              HasSubstr("<｜title｜>"));
}

// --- Format detection --------------------------------------------------------

TEST(DetectChatFormatTest, FromConfig) {
  EXPECT_EQ(*DetectChatFormat(R"({"model_type":"deepseek_v4"})"),
            ChatFormat::kV4Preview);
  EXPECT_EQ(*DetectChatFormat(
                R"({"model_type":"deepseek_v4","dspark_block_size":5,)"
                R"("dspark_markov_rank":256,"dspark_noise_token_id":128799,)"
                R"("dspark_target_layer_ids":[37,38,39]})"),
            ChatFormat::kV4_0731);
  EXPECT_EQ(*DetectChatFormat(R"({"model_type":"deepseek_v41",)"
                              R"("dspark_block_size":5})"),
            ChatFormat::kV41);
  EXPECT_EQ(
      *DetectChatFormat(
          R"({"model_type":"x","text_config":{"model_type":"deepseek_v41"}})"),
      ChatFormat::kV41);
  for (const char* bad :
       {"", "[]", "{",
        R"({"model_type":"deepseek_v4","dspark_block_size":5})"}) {
    EXPECT_EQ(DetectChatFormat(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// --- Bad input ---------------------------------------------------------------

TEST_F(FormatsTest, RejectsBadToolConversations) {
  const auto expect_error = [&](const std::vector<ChatMessage>& messages,
                                const ChatRenderOptions& options,
                                const std::string& words) {
    const absl::Status status = Error(messages, options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << words;
    EXPECT_THAT(status.message(), HasSubstr(words));
  };
  const ChatRenderOptions plain;
  const ChatMessage asked =
      Assistant("", "", {{"call_1", "lookup", R"({"query":"x"})"}});
  expect_error({User("q"), asked, Tool("call_2", "r")}, plain,
               "message 2 (tool): tool_call_id 'call_2'");
  expect_error({User("q"), Tool("call_1", "r")}, plain,
               "message 1 (tool): no assistant message with tool_calls");
  expect_error({User("q"), asked, Tool("call_1", "r"), Assistant("ok"),
                Tool("call_1", "again")},
               plain, "message 4 (tool)");
  for (const std::string arguments :
       {"\"scalar\"", "[1]", "not json", "", "{\"a\":1", "null"}) {
    expect_error({User("q"), Assistant("", "", {{"i", "f", arguments}})}, plain,
                 "messages[1].tool_calls[0].function.arguments must be a JSON "
                 "object");
  }
  expect_error({User("q"), Assistant("", "", {{"i", "", "{}"}})}, plain,
               "messages[1].tool_calls[0].function.name");
  ChatMessage user_calls = User("q");
  user_calls.tool_calls = {{"i", "f", "{}"}};
  expect_error({user_calls}, plain, "message 0 (user)");
  ChatMessage user_id = User("q");
  user_id.tool_call_id = "i";
  expect_error({user_id}, plain, "tool_call_id");
  ChatMessage assistant_task = Assistant("a");
  assistant_task.task = ChatTask::kQuery;
  expect_error({User("q"), assistant_task}, plain, "task");
  expect_error({Developer(""), User("q")}, plain, "message 0 (developer)");

  ChatRenderOptions tools;
  tools.tool_functions = {kLookup, "[1]"};
  expect_error({User("q")}, tools, "tools[1].function must be a JSON object");
  tools.tool_functions = {"{\"a\":"};
  expect_error({User("q")}, tools, "tools[0].function");
  tools.tool_functions = {kLookup};
  tools.tools_message_index = 1;
  expect_error({System("s"), User("q")}, tools, "tools_message_index 1");
  tools.tools_message_index = 7;
  expect_error({System("s"), User("q")}, tools, "tools_message_index 7");
  ChatRenderOptions format;
  format.response_format = "{oops";
  expect_error({User("q")}, format, "response_format");
  ChatMessage unknown_role = User("q");
  unknown_role.role = static_cast<ChatRole>(42);
  expect_error({unknown_role}, plain, "unknown role");
}

TEST_F(FormatsTest, LargeAndDeepInputsFailCleanly) {
  const std::string deep = absl::StrCat("{\"a\":", std::string(100000, '['),
                                        std::string(100000, ']'), "}");
  EXPECT_EQ(Error({User("q"), Assistant("", "", {{"i", "f", deep}})},
                  ChatRenderOptions())
                .code(),
            absl::StatusCode::kInvalidArgument);
  ChatRenderOptions tools;
  tools.tool_functions = {deep};
  EXPECT_EQ(Error({User("q")}, tools).code(),
            absl::StatusCode::kInvalidArgument);
  // Many messages, calls and results render.
  std::vector<ChatMessage> many = {User("q")};
  std::vector<ToolCall> calls;
  calls.reserve(200);
  for (int i = 0; i < 200; ++i) {
    calls.push_back(
        {absl::StrCat("c", i), "f", absl::StrCat("{\"i\":", i, "}")});
  }
  many.push_back(Assistant("", "", calls));
  for (int i = 199; i >= 0; --i) {
    many.push_back(Tool(absl::StrCat("c", i), absl::StrCat("r", i)));
  }
  const std::string prompt = V4(many, ChatRenderOptions());
  EXPECT_LT(prompt.find("<tool_result>r0</tool_result>"),
            prompt.find("<tool_result>r199</tool_result>"));
}

}  // namespace
}  // namespace mneme::text
