#include "text/chat_output_parser.h"

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mneme::text {
namespace {

using ::testing::MatchesRegex;
using ::testing::Optional;
using ::testing::SizeIs;

// ｜ is U+FF5C.
const std::string kDsml =
    "\xEF\xBD\x9C"
    "DSML"
    "\xEF\xBD\x9C";

struct Dialect {
  std::string block_start;
  std::string block_end;
  std::string invoke;  // up to and including `name="`
  std::string invoke_end;
  std::string param;  // `<｜DSML｜parameter`
  std::string param_end;
};

Dialect Tags(DsmlDialect dialect) {
  const std::string sp = dialect == DsmlDialect::kV41 ? " " : "";
  const std::string block =
      dialect == DsmlDialect::kV41 ? " calls" : "tool_calls";
  return Dialect{
      absl::StrCat("<", kDsml, block, ">"),
      absl::StrCat("</", kDsml, block, ">"),
      absl::StrCat("<", kDsml, sp, "invoke name=\""),
      absl::StrCat("</", kDsml, sp, "invoke>"),
      absl::StrCat("<", kDsml, sp, "parameter"),
      absl::StrCat("</", kDsml, sp, "parameter>"),
  };
}

std::string Invoke(const Dialect& t, absl::string_view name,
                   absl::string_view params) {
  return absl::StrCat(t.invoke, name, "\">\n", params, t.invoke_end, "\n");
}

std::string Param(const Dialect& t, absl::string_view name, bool is_string,
                  absl::string_view value) {
  return absl::StrCat(t.param, " name=\"", name, "\" string=\"",
                      is_string ? "true" : "false", "\">", value, t.param_end,
                      "\n");
}

std::string Block(const Dialect& t, absl::string_view invokes) {
  return absl::StrCat("\n\n", t.block_start, "\n", invokes, t.block_end);
}

ChatOutputParserOptions Options(bool thinking = true,
                                DsmlDialect dialect = DsmlDialect::kV4) {
  ChatOutputParserOptions options;
  options.thinking = thinking;
  options.dialect = dialect;
  options.id_seed = 42;
  return options;
}

// What a client assembles from the streamed deltas.
struct Streamed {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> calls;
  bool saw_tool_calls = false;
};

void Accumulate(const std::vector<ChatOutputDelta>& deltas, Streamed* s) {
  for (const ChatOutputDelta& d : deltas) {
    switch (d.kind) {
      case ChatOutputDelta::kReasoning:
        s->reasoning += d.text;
        break;
      case ChatOutputDelta::kContent:
        s->content += d.text;
        break;
      case ChatOutputDelta::kToolCallBegin:
        ASSERT_EQ(d.index, static_cast<int>(s->calls.size()));
        s->calls.push_back(ParsedToolCall{d.id, d.name, ""});
        break;
      case ChatOutputDelta::kToolCallArguments:
        ASSERT_GE(d.index, 0);
        ASSERT_LT(d.index, static_cast<int>(s->calls.size()));
        // Fragments only go to the newest call.
        ASSERT_EQ(d.index, static_cast<int>(s->calls.size()) - 1);
        s->calls[d.index].arguments += d.text;
        break;
    }
  }
}

Streamed Stream(const std::vector<std::string>& pieces,
                const ChatOutputParserOptions& options) {
  ChatOutputParser parser(options);
  Streamed s;
  for (const std::string& piece : pieces) Accumulate(parser.Feed(piece), &s);
  Accumulate(parser.Finish(), &s);
  s.saw_tool_calls = parser.saw_tool_calls();
  return s;
}

nlohmann::json Json(absl::string_view text) {
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
}

// Streaming and whole parsing agree.
void ExpectSame(const Streamed& s, const ParsedChatOutput& p) {
  EXPECT_EQ(s.reasoning, p.reasoning.value_or(""));
  EXPECT_EQ(s.content, p.content.value_or(""));
  ASSERT_EQ(s.calls.size(), p.tool_calls.size());
  for (size_t i = 0; i < s.calls.size(); ++i) {
    EXPECT_EQ(s.calls[i].id, p.tool_calls[i].id);
    EXPECT_EQ(s.calls[i].name, p.tool_calls[i].name);
    const nlohmann::json streamed = Json(s.calls[i].arguments);
    ASSERT_FALSE(streamed.is_discarded()) << s.calls[i].arguments;
    ASSERT_TRUE(streamed.is_object()) << s.calls[i].arguments;
    EXPECT_EQ(streamed, Json(p.tool_calls[i].arguments))
        << s.calls[i].arguments << " vs " << p.tool_calls[i].arguments;
  }
}

TEST(ChatOutputParserTest, ChatFormatExample) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string text = absl::StrCat(
      "The user wants weather and time.</think>Let me check.",
      Block(t, absl::StrCat(
                   Invoke(t, "get_weather",
                          absl::StrCat(Param(t, "location", true, "Beijing"),
                                       Param(t, "days", false, "3"))),
                   Invoke(t, "get_time", Param(t, "tz", true, "UTC")))));
  const ParsedChatOutput out = ParseChatOutput(text, Options());
  EXPECT_THAT(out.reasoning,
              Optional(std::string("The user wants weather and time.")));
  EXPECT_THAT(out.content, Optional(std::string("Let me check.")));
  ASSERT_THAT(out.tool_calls, SizeIs(2));
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json(out.tool_calls[0].arguments),
            nlohmann::json({{"location", "Beijing"}, {"days", 3}}));
  EXPECT_EQ(out.tool_calls[1].name, "get_time");
  EXPECT_EQ(Json(out.tool_calls[1].arguments), nlohmann::json({{"tz", "UTC"}}));
  for (const ParsedToolCall& call : out.tool_calls) {
    EXPECT_THAT(call.id, MatchesRegex("call_[0-9a-f]{24}"));
  }
  EXPECT_NE(out.tool_calls[0].id, out.tool_calls[1].id);

  // Streamed whole: the deltas in order.
  ChatOutputParser parser(Options());
  std::vector<ChatOutputDelta> deltas = parser.Feed(text);
  for (ChatOutputDelta& d : parser.Finish()) deltas.push_back(std::move(d));
  ASSERT_THAT(deltas, SizeIs(6));
  EXPECT_EQ(deltas[0].kind, ChatOutputDelta::kReasoning);
  EXPECT_EQ(deltas[1].kind, ChatOutputDelta::kContent);
  EXPECT_EQ(deltas[1].text, "Let me check.");
  EXPECT_EQ(deltas[2].kind, ChatOutputDelta::kToolCallBegin);
  EXPECT_EQ(deltas[2].index, 0);
  EXPECT_EQ(deltas[2].name, "get_weather");
  EXPECT_EQ(deltas[3].kind, ChatOutputDelta::kToolCallArguments);
  EXPECT_EQ(deltas[3].text, R"({"location":"Beijing","days":3})");
  EXPECT_EQ(deltas[4].kind, ChatOutputDelta::kToolCallBegin);
  EXPECT_EQ(deltas[4].index, 1);
  EXPECT_EQ(deltas[5].text, R"({"tz":"UTC"})");
  EXPECT_TRUE(parser.saw_tool_calls());
}

TEST(ChatOutputParserTest, IdsAreDeterministicPerSeed) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string text =
      absl::StrCat("</think>", Block(t, Invoke(t, "f", "")));
  ChatOutputParserOptions a = Options();
  ChatOutputParserOptions b = Options();
  b.id_seed = 43;
  EXPECT_EQ(ParseChatOutput(text, a).tool_calls.at(0).id,
            ParseChatOutput(text, a).tool_calls.at(0).id);
  EXPECT_NE(ParseChatOutput(text, a).tool_calls.at(0).id,
            ParseChatOutput(text, b).tool_calls.at(0).id);
  // No parameters: an empty object.
  EXPECT_EQ(ParseChatOutput(text, a).tool_calls.at(0).arguments, "{}");
}

TEST(ChatOutputParserTest, ReasoningOnlyWhenTruncated) {
  const ParsedChatOutput out =
      ParseChatOutput("Let me think about this carefully", Options());
  EXPECT_THAT(out.reasoning,
              Optional(std::string("Let me think about this carefully")));
  EXPECT_EQ(out.content, std::nullopt);
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ChatOutputParserTest, EmptyContentIsNull) {
  const ParsedChatOutput out = ParseChatOutput("thought</think>", Options());
  EXPECT_THAT(out.reasoning, Optional(std::string("thought")));
  EXPECT_EQ(out.content, std::nullopt);
}

TEST(ChatOutputParserTest, ChatModeIsAllContent) {
  const ParsedChatOutput out =
      ParseChatOutput("Hello <think>x</think> world", Options(false));
  EXPECT_EQ(out.reasoning, std::nullopt);
  // A stray </think> is dropped; <think> in content stays text.
  EXPECT_THAT(out.content, Optional(std::string("Hello <think>x world")));
}

TEST(ChatOutputParserTest, RepeatedThinkStartAndStrayThinkEnd) {
  const ParsedChatOutput out =
      ParseChatOutput("<think>a</think>b</think>c", Options());
  EXPECT_THAT(out.reasoning, Optional(std::string("a")));
  EXPECT_THAT(out.content, Optional(std::string("bc")));
}

TEST(ChatOutputParserTest, BlockStartEndsReasoning) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string text = absl::StrCat(
      "I will call f.", Block(t, Invoke(t, "f", Param(t, "a", true, "1"))));
  const ParsedChatOutput out = ParseChatOutput(text, Options());
  EXPECT_THAT(out.reasoning, Optional(std::string("I will call f.")));
  EXPECT_EQ(out.content, std::nullopt);
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(Json(out.tool_calls[0].arguments), nlohmann::json({{"a", "1"}}));
}

TEST(ChatOutputParserTest, BlockFirstGivesNullContentAndDropsTrailingText) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string text =
      absl::StrCat("r</think>", Block(t, Invoke(t, "f", "")),
                   "trailing text <｜end▁of▁sentence｜>");
  const ParsedChatOutput out = ParseChatOutput(text, Options());
  EXPECT_EQ(out.content, std::nullopt);
  ASSERT_THAT(out.tool_calls, SizeIs(1));
}

TEST(ChatOutputParserTest, OnlyTheLastNewlinesBeforeTheBlockAreDropped) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string text =
      absl::StrCat("</think>a\n\nb\n", Block(t, Invoke(t, "f", "")));
  EXPECT_THAT(ParseChatOutput(text, Options()).content,
              Optional(std::string("a\n\nb")));
  // Without a block, trailing newlines are content.
  EXPECT_THAT(ParseChatOutput("</think>a\n\n", Options()).content,
              Optional(std::string("a\n\n")));
}

TEST(ChatOutputParserTest, ToolsDisabledKeepsDsmlAsContent) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string block = Block(t, Invoke(t, "f", Param(t, "a", true, "1")));
  ChatOutputParserOptions options = Options(false);
  options.tools_enabled = false;
  const ParsedChatOutput out =
      ParseChatOutput(absl::StrCat("x", block), options);
  EXPECT_THAT(out.content, Optional(absl::StrCat("x", block)));
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ChatOutputParserTest, V41Dialect) {
  const Dialect t = Tags(DsmlDialect::kV41);
  const std::string text = absl::StrCat(
      "why</think>ok",
      Block(t, absl::StrCat(Invoke(t, "search", Param(t, "q", true, "x y")),
                            Invoke(t, "add", Param(t, "n", false, "[1, 2]")))));
  const ParsedChatOutput out =
      ParseChatOutput(text, Options(true, DsmlDialect::kV41));
  EXPECT_THAT(out.content, Optional(std::string("ok")));
  ASSERT_THAT(out.tool_calls, SizeIs(2));
  EXPECT_EQ(Json(out.tool_calls[0].arguments), nlohmann::json({{"q", "x y"}}));
  EXPECT_EQ(Json(out.tool_calls[1].arguments),
            nlohmann::json::parse(R"({"n":[1,2]})"));
  // The V4 spelling is plain text to a V4.1 parser, and the other way round.
  const ParsedChatOutput v4 = ParseChatOutput(text, Options(true));
  EXPECT_TRUE(v4.tool_calls.empty());
  EXPECT_THAT(v4.content, Optional(text.substr(text.find("ok"))));
}

TEST(ChatOutputParserTest, CoercesByParameterType) {
  const Dialect t = Tags(DsmlDialect::kV4);
  ChatOutputParserOptions options = Options();
  options.parameter_types["f"] = {
      {"n", "integer"}, {"x", "number"}, {"w", "float"}, {"b", "boolean"},
      {"o", "object"},  {"s", "string"}, {"z", "null"},  {"bad", "integer"}};
  const std::string text = absl::StrCat(
      "</think>",
      Block(t,
            Invoke(
                t, "f",
                absl::StrCat(
                    Param(t, "n", false, " 007"), Param(t, "x", false, "2.50"),
                    Param(t, "w", false, "4.0"), Param(t, "b", false, "True"),
                    Param(t, "o", false, R"({"a": [1, 2]})"),
                    Param(t, "s", false, "plain"), Param(t, "z", false, "null"),
                    Param(t, "bad", false, "seven"),
                    Param(t, "u", false, "[true, null]"),
                    Param(t, "v", false, "not json")))));
  const ParsedChatOutput out = ParseChatOutput(text, options);
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(Json(out.tool_calls[0].arguments), nlohmann::json::parse(R"({
      "n": 7, "x": 2.5, "w": 4, "b": true, "o": {"a": [1, 2]}, "s": "plain",
      "z": null, "bad": "seven", "u": [true, null], "v": "not json"})"));
  // Key order is the model's.
  EXPECT_EQ(out.tool_calls[0].arguments.substr(0, 6), R"({"n":7)");
}

TEST(ChatOutputParserTest, StringValuesAreEscapedAndKeepNonAscii) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string value =
      "北京 \"quoted\" back\\slash\n\ttab \x01 émoji 😀 <b>tag</b>";
  const std::string text = absl::StrCat(
      "</think>", Block(t, Invoke(t, "f", Param(t, "city", true, value))));
  const ParsedChatOutput out = ParseChatOutput(text, Options());
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(Json(out.tool_calls[0].arguments),
            nlohmann::json({{"city", value}}));
  // Raw UTF-8 is kept, not \u-escaped.
  EXPECT_NE(out.tool_calls[0].arguments.find("北京"), std::string::npos);
  // Invalid UTF-8 becomes U+FFFD rather than breaking the JSON.
  const std::string bad = absl::StrCat(
      "</think>", Block(t, Invoke(t, "f", Param(t, "a", true, "x\xFFy"))));
  const ParsedChatOutput bad_out = ParseChatOutput(bad, Options());
  ASSERT_THAT(bad_out.tool_calls, SizeIs(1));
  EXPECT_EQ(Json(bad_out.tool_calls[0].arguments),
            nlohmann::json({{"a", "x\xEF\xBF\xBDy"}}));
}

TEST(ChatOutputParserTest, RepeatedParameterKeepsLastValue) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string text = absl::StrCat(
      "</think>", Block(t, Invoke(t, "f",
                                  absl::StrCat(Param(t, "a", true, "1"),
                                               Param(t, "b", true, "2"),
                                               Param(t, "a", true, "3")))));
  const ParsedChatOutput out = ParseChatOutput(text, Options());
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"a":"3","b":"2"})");
}

TEST(ChatOutputParserTest, MalformedBlockBeforeAnyCallIsContent) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string block =
      absl::StrCat("\n\n", t.block_start, "\nnot an invoke", t.block_end);
  const ParsedChatOutput out =
      ParseChatOutput(absl::StrCat("</think>Hi", block), Options());
  EXPECT_TRUE(out.tool_calls.empty());
  EXPECT_THAT(out.content, Optional(absl::StrCat("Hi", block)));

  // A bad invoke tag.
  const std::string bad_name = absl::StrCat("\n\n", t.block_start, "\n",
                                            t.invoke, "f\" x>", t.block_end);
  const ParsedChatOutput out2 =
      ParseChatOutput(absl::StrCat("</think>Hi", bad_name), Options());
  EXPECT_TRUE(out2.tool_calls.empty());
  EXPECT_THAT(out2.content, Optional(absl::StrCat("Hi", bad_name)));
}

TEST(ChatOutputParserTest, MalformedInsideCallClosesItAndKeepsTheRest) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::string bad_param =
      absl::StrCat(t.param, " name=\"b\" string=\"maybe\">2", t.param_end);
  const std::string text = absl::StrCat(
      "</think>", "\n\n", t.block_start, "\n", t.invoke, "f\">\n",
      Param(t, "a", true, "x"), bad_param, t.invoke_end, t.block_end);
  for (const size_t split : {size_t{0}, size_t{5}, text.size() / 2}) {
    SCOPED_TRACE(split);
    const Streamed s =
        Stream({text.substr(0, split), text.substr(split)}, Options());
    ASSERT_THAT(s.calls, SizeIs(1));
    EXPECT_EQ(Json(s.calls[0].arguments), nlohmann::json({{"a", "x"}}));
    EXPECT_EQ(s.content, absl::StrCat(bad_param, t.invoke_end, t.block_end));
    EXPECT_TRUE(s.saw_tool_calls);
  }
}

TEST(ChatOutputParserTest, GarbageNeverCrashesAndKeepsText) {
  const Dialect t = Tags(DsmlDialect::kV4);
  const std::vector<std::string> inputs = {
      t.block_start,
      absl::StrCat(t.block_start, t.invoke),
      absl::StrCat(t.block_start, t.invoke, "\">"),
      absl::StrCat(t.block_start, t.invoke, "f\">", t.param, ">"),
      absl::StrCat(t.block_start, t.invoke, "f\">", t.param_end, t.invoke_end),
      absl::StrCat(t.block_end, t.invoke_end, t.param_end),
      absl::StrCat("<", kDsml, "<", kDsml, "tool", t.block_start, "<"),
  };
  for (const std::string& text : inputs) {
    SCOPED_TRACE(text);
    const ParsedChatOutput out = ParseChatOutput(text, Options(false));
    for (const ParsedToolCall& call : out.tool_calls) {
      EXPECT_TRUE(Json(call.arguments).is_object());
    }
    // Every byte of a block that produced no call comes back.
    if (out.tool_calls.empty()) {
      EXPECT_EQ(out.content.value_or(""), text);
    }
  }
}

TEST(ChatOutputParserTest, TruncatedBlock) {
  const Dialect t = Tags(DsmlDialect::kV4);
  // Cut inside a string value: the call keeps what came.
  std::string text = absl::StrCat(
      "</think>",
      Block(t, Invoke(t, "f",
                      absl::StrCat(Param(t, "a", false, "1"),
                                   Param(t, "b", true, "hello world")))));
  std::string cut = text.substr(0, text.find("world"));
  ParsedChatOutput out = ParseChatOutput(cut, Options());
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(Json(out.tool_calls[0].arguments),
            nlohmann::json({{"a", 1}, {"b", "hello "}}));
  // Cut inside a non-string value: that parameter is dropped.
  cut = text.substr(0, text.find("\">1") + 3);
  out = ParseChatOutput(cut, Options());
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(out.tool_calls[0].arguments, "{}");
  // Cut inside the first invoke tag: the text comes back as content.
  cut = text.substr(0, text.find("f\">"));
  out = ParseChatOutput(cut, Options());
  EXPECT_TRUE(out.tool_calls.empty());
  EXPECT_THAT(out.content, Optional(cut.substr(8)));
}

TEST(ChatOutputParserTest, BoundsTurnTheRestIntoContent) {
  const Dialect t = Tags(DsmlDialect::kV4);
  ChatOutputParserOptions options = Options();
  options.max_tool_calls = 2;
  const std::string third = Invoke(t, "h", "");
  const std::string text = absl::StrCat(
      "</think>",
      Block(t, absl::StrCat(Invoke(t, "f", ""), Invoke(t, "g", ""), third)));
  ParsedChatOutput out = ParseChatOutput(text, options);
  ASSERT_THAT(out.tool_calls, SizeIs(2));
  EXPECT_THAT(out.content, Optional(absl::StrCat(third, t.block_end)));

  options = Options();
  options.max_tag_bytes = 8;
  out = ParseChatOutput(
      absl::StrCat("</think>", Block(t, Invoke(t, "a_very_long_name", ""))),
      options);
  EXPECT_TRUE(out.tool_calls.empty());

  options = Options();
  options.max_value_bytes = 4;
  out = ParseChatOutput(
      absl::StrCat("</think>",
                   Block(t, Invoke(t, "f", Param(t, "a", false, "123456")))),
      options);
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(out.tool_calls[0].arguments, "{}");
  EXPECT_TRUE(out.content.has_value());

  options = Options();
  options.max_parameters = 1;
  out = ParseChatOutput(
      absl::StrCat("</think>",
                   Block(t, Invoke(t, "f",
                                   absl::StrCat(Param(t, "a", true, "1"),
                                                Param(t, "b", true, "2"))))),
      options);
  ASSERT_THAT(out.tool_calls, SizeIs(1));
  EXPECT_EQ(Json(out.tool_calls[0].arguments), nlohmann::json({{"a", "1"}}));
}

TEST(ChatOutputParserTest, HeldBackTextIsBounded) {
  ChatOutputParser parser(Options(false));
  size_t sent = 0;
  const std::string piece = "abc<｜DSML｜tool_calls";  // never completes
  for (int i = 0; i < 1000; ++i) {
    for (const ChatOutputDelta& d : parser.Feed(piece)) sent += d.text.size();
  }
  EXPECT_GE(sent + 64, piece.size() * 1000);
}

// Parameter names with spaces, an attribute-like text or nothing at all, with
// the output split before every character (as deepseek-recipe's stream test).
TEST(ChatOutputParserTest, UnusualParameterNamesAtEveryCharacterSplit) {
  const nlohmann::json expected = nlohmann::json::parse(
      R"({"shipping address": "Paris\n日本", " string= mode ": {"enabled": true},
          "count": 2, "": "empty key"})");
  for (const DsmlDialect dialect : {DsmlDialect::kV4, DsmlDialect::kV41}) {
    const Dialect t = Tags(dialect);
    const std::string text = absl::StrCat(
        t.block_start, "\n",
        Invoke(t, "submit",
               absl::StrCat(
                   Param(t, "shipping address", true, "Paris\n日本"),
                   Param(t, " string= mode ", false, R"({"enabled":true})"),
                   Param(t, "count", false, "2"),
                   Param(t, "", true, "empty key"))),
        t.block_end);
    const ChatOutputParserOptions options = Options(false, dialect);
    for (size_t i = 0; i <= text.size(); ++i) {
      // Character boundaries only.
      if (i < text.size() &&
          (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {
        continue;
      }
      SCOPED_TRACE(i);
      const Streamed s = Stream({text.substr(0, i), text.substr(i)}, options);
      ASSERT_THAT(s.calls, SizeIs(1));
      EXPECT_EQ(s.calls[0].name, "submit");
      EXPECT_EQ(Json(s.calls[0].arguments), expected) << s.calls[0].arguments;
      EXPECT_TRUE(s.content.empty()) << s.content;
      EXPECT_TRUE(s.saw_tool_calls);
    }
  }
}

// Every split of each text into two and three pieces at any byte gives the
// same result as parsing it whole.
TEST(ChatOutputParserTest, EverySplitPointMatchesWholeParse) {
  for (const DsmlDialect dialect : {DsmlDialect::kV4, DsmlDialect::kV41}) {
    const Dialect t = Tags(dialect);
    const std::vector<std::string> texts = {
        absl::StrCat(
            "think 思考</think>\nanswer",
            Block(t, absl::StrCat(
                         Invoke(t, "f",
                                absl::StrCat(
                                    Param(t, "a", true, "v<a/>\"é"),
                                    Param(t, "n", false, "[1, {\"k\": 2}]"))),
                         Invoke(t, "g", "")))),
        absl::StrCat("a</thi", "nk></think>b\n\n", t.block_start, "junk"),
        absl::StrCat("r", Block(t, Invoke(t, "f", Param(t, "a", true, "x"))),
                     "after"),
    };
    for (const std::string& text : texts) {
      const ChatOutputParserOptions options = Options(true, dialect);
      const ParsedChatOutput whole = ParseChatOutput(text, options);
      for (size_t i = 0; i <= text.size(); ++i) {
        SCOPED_TRACE(absl::StrCat("split ", i));
        ExpectSame(Stream({text.substr(0, i), text.substr(i)}, options), whole);
        if (::testing::Test::HasFailure()) return;
      }
      // One byte at a time.
      std::vector<std::string> bytes;
      for (const char c : text) bytes.emplace_back(1, c);
      ExpectSame(Stream(bytes, options), whole);
    }
  }
}

// Random tool calls with random values, streamed in random pieces: the
// streamed arguments are valid JSON equal to the values generated, and to
// the whole parse.
TEST(ChatOutputParserTest, RandomSplitsMatchGeneratedCalls) {
  std::mt19937_64 rng(12345);
  const std::vector<std::string> atoms = {
      "a",  "Z", " ",  "\n", "\"",  "\\",       "<",        ">", "/", "é",
      "北", "😀", "\t", "</", "<｜", "｜DSML｜", "</think>", "{", "}", "0",
  };
  auto random_string = [&](size_t max_atoms) {
    std::string s;
    const size_t n = rng() % (max_atoms + 1);
    for (size_t i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    return s;
  };
  for (int round = 0; round < 300; ++round) {
    const DsmlDialect dialect =
        rng() % 2 ? DsmlDialect::kV4 : DsmlDialect::kV41;
    const Dialect t = Tags(dialect);
    ChatOutputParserOptions options = Options(true, dialect);
    options.id_seed = rng();
    // Reasoning and content must not contain tags that would end them.
    const std::string reasoning = absl::StrCat("why ", round, " é");
    const std::string content = rng() % 2 ? absl::StrCat("answer ", round) : "";
    std::string invokes;
    std::vector<nlohmann::json> expected;
    const size_t calls = 1 + rng() % 3;
    for (size_t c = 0; c < calls; ++c) {
      nlohmann::json args = nlohmann::json::object();
      std::string params;
      const size_t n = rng() % 4;
      for (size_t p = 0; p < n; ++p) {
        const std::string name = absl::StrCat("p", p);
        if (rng() % 2) {
          std::string value = random_string(8);
          // A value cannot contain its own close tag.
          if (value.find(t.param_end) != std::string::npos) value = "x";
          args[name] = value;
          params += Param(t, name, true, value);
        } else {
          nlohmann::json value;
          switch (rng() % 4) {
            case 0:
              value = static_cast<int64_t>(rng() % 2000) - 1000;
              break;
            case 1:
              value = rng() % 2 == 0;
              break;
            case 2:
              value = nlohmann::json::array({1, random_string(3)});
              break;
            default:
              value = nlohmann::json{{"k", random_string(3)}};
              break;
          }
          args[name] = value;
          params += Param(t, name, false, value.dump());
        }
      }
      expected.push_back(args);
      invokes += Invoke(t, absl::StrCat("tool_", c), params);
    }
    const std::string text =
        absl::StrCat(reasoning, "</think>", content, Block(t, invokes));
    const ParsedChatOutput whole = ParseChatOutput(text, options);
    ASSERT_THAT(whole.tool_calls, SizeIs(calls)) << text;
    for (size_t c = 0; c < calls; ++c) {
      EXPECT_EQ(whole.tool_calls[c].name, absl::StrCat("tool_", c));
      EXPECT_EQ(Json(whole.tool_calls[c].arguments), expected[c])
          << whole.tool_calls[c].arguments;
    }
    EXPECT_THAT(whole.reasoning, Optional(reasoning));
    EXPECT_EQ(whole.content.value_or(""), content);
    EXPECT_EQ(whole.content.has_value(), !content.empty());

    for (int trial = 0; trial < 5; ++trial) {
      std::vector<std::string> pieces;
      size_t pos = 0;
      while (pos < text.size()) {
        const size_t len = 1 + rng() % 12;
        pieces.push_back(text.substr(pos, len));
        pos += len;
      }
      const Streamed s = Stream(pieces, options);
      EXPECT_TRUE(s.saw_tool_calls);
      ExpectSame(s, whole);
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "text: " << text;
        return;
      }
    }
  }
}

// Random sequences of tag pieces and text, malformed or not: streaming in
// random pieces gives what the whole parse gives, arguments are always JSON
// objects, and nothing crashes.
TEST(ChatOutputParserTest, RandomMarkupStreamsLikeTheWholeParse) {
  std::mt19937_64 rng(777);
  for (int round = 0; round < 2000; ++round) {
    const DsmlDialect dialect =
        rng() % 2 ? DsmlDialect::kV4 : DsmlDialect::kV41;
    const Dialect t = Tags(dialect);
    const std::vector<std::string> atoms = {t.block_start,
                                            t.block_end,
                                            t.invoke,
                                            t.invoke_end,
                                            t.param,
                                            t.param_end,
                                            " name=\"a\" string=\"true\">",
                                            " name=\"b\" string=\"false\">",
                                            "f\">",
                                            "\"",
                                            ">",
                                            "<",
                                            "\n",
                                            "\n\n",
                                            " ",
                                            "x",
                                            "1",
                                            "[2]",
                                            "é",
                                            "</think>",
                                            "<think>",
                                            "{"};
    std::string text;
    const size_t n = rng() % 24;
    for (size_t i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    ChatOutputParserOptions options = Options(rng() % 2 == 0, dialect);
    options.max_tool_calls = 1 + rng() % 3;
    options.max_parameters = 1 + rng() % 3;
    options.max_tag_bytes = 4 + rng() % 40;
    options.max_value_bytes = 1 + rng() % 8;
    const ParsedChatOutput whole = ParseChatOutput(text, options);
    std::vector<std::string> pieces;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t len = 1 + rng() % 6;
      pieces.push_back(text.substr(pos, len));
      pos += len;
    }
    ExpectSame(Stream(pieces, options), whole);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "text: " << text;
      return;
    }
  }
}

}  // namespace
}  // namespace mneme::text
