// The OpenAI request parser (fields, bounds, prompts, tools, reasoning
// settings) and the choice builder (text, reasoning, tool calls, logprobs in
// the endpoints' shapes) over the synthetic tokenizer.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/chat_request.h"
#include "services/coordinator/openai_choice.h"
#include "services/coordinator/openai_request.h"
#include "services/coordinator/request_validator.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::coordinator {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

class OpenAiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<text::Tokenizer>> t =
        text::Tokenizer::FromJson(synthetic::SyntheticTokenizerJson());
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = *std::move(t);
    text::ChatTemplateOptions options;
    options.missing_special_tokens = text::MissingSpecialTokens::kRenderAsText;
    absl::StatusOr<std::unique_ptr<text::DeepSeekV4ChatTemplate>> tmpl =
        text::DeepSeekV4ChatTemplate::Create(*tokenizer_, options);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    template_ = *std::move(tmpl);
  }

  static json Body(const json& fields) {
    json body = {{"model", "m"}};
    body.update(fields);
    return body;
  }

  // Parses a completion request; the error's param, or "" when it parsed.
  std::string CompletionError(const json& body, OpenAiRequest& request) {
    if (std::optional<HttpError> e =
            ParseOpenAiCommon(body, "m", false, request)) {
      return e->param;
    }
    if (std::optional<HttpError> e =
            ParseCompletionPrompts(body, *tokenizer_, request)) {
      return e->param;
    }
    return "";
  }
  std::string ChatError(const json& body, OpenAiRequest& request,
                        const json& defaults = json::object()) {
    if (std::optional<HttpError> e =
            ParseOpenAiCommon(body, "m", true, request)) {
      return e->param;
    }
    if (std::optional<HttpError> e = ParseChat(
            body, *template_, *tokenizer_, defaults, body.dump(), request)) {
      return e->param;
    }
    return "";
  }

  std::vector<int64_t> Ids(const std::string& text) {
    absl::StatusOr<std::vector<int64_t>> ids =
        tokenizer_->Encode(text, text::AddSpecialTokens::kNo);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int64_t>{};
  }

  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<text::DeepSeekV4ChatTemplate> template_;
};

TEST_F(OpenAiTest, BadFieldsNameTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {Body({{"prompt", "x"}, {"n", 0}}), "n"},
      {Body({{"prompt", "x"}, {"n", kMaxChoicesPerPrompt + 1}}), "n"},
      {Body({{"prompt", "x"}, {"logprobs", 21}}), "logprobs"},
      {Body({{"prompt", "x"}, {"logprobs", true}}), "logprobs"},
      {Body({{"prompt", "x"}, {"echo", 1}}), "echo"},
      {Body({{"prompt", "x"}, {"max_tokens", 0}}), "max_tokens"},
      {Body({{"prompt", "x"}, {"prompt_logprobs", 21}}), "prompt_logprobs"},
      {Body({{"prompt", "x"}, {"presence_penalty", 0.5}}), "presence_penalty"},
      {Body({{"prompt", "x"}, {"logit_bias", {{"5", 1}}}}), "logit_bias"},
      {Body({{"prompt", "x"}, {"best_of", 2}}), "best_of"},
      {Body({{"prompt", "x"}, {"stop_token_ids", std::vector<int>(65, 1)}}),
       "stop_token_ids"},
      {Body({{"prompt", json::array()}}), "prompt"},
      {Body({{"prompt", {{1, 2}, "x", 3}}}), "prompt[2]"},
      {Body({{"prompt", {{1, "a"}}}}), "prompt[0]"},
      {Body({{"prompt",
              std::vector<std::string>(kMaxChoicesPerRequest + 1, "x")}}),
       "prompt"},
      {Body({{"prompt", {"x", "y", "z"}}, {"n", 32}}), "n"},
      {Body({{"prompt", {"x", "y", "z", "w", "v"}}, {"n", 16}}), "prompt"},
      {Body({{"prompt", "x"}, {"seed", 1.5}}), "seed"},
  };
  for (const auto& [body, param] : cases) {
    OpenAiRequest request;
    EXPECT_EQ(CompletionError(body, request), param) << body.dump();
  }
  OpenAiRequest request;
  std::optional<HttpError> e =
      ParseOpenAiCommon(Body({{"model", "other"}}), "m", false, request);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->param, "model");
}

TEST_F(OpenAiTest, PromptsInEveryShape) {
  OpenAiRequest a;
  ASSERT_EQ(CompletionError(Body({{"prompt", "hello"}}), a), "");
  ASSERT_EQ(a.prompts.size(), 1u);
  EXPECT_EQ(a.prompt_texts[0], "hello");

  OpenAiRequest b;
  ASSERT_EQ(CompletionError(Body({{"prompt", {5, 6, 7}}}), b), "");
  ASSERT_EQ(b.prompts.size(), 1u);
  EXPECT_EQ(b.prompts[0], (std::vector<int64_t>{5, 6, 7}));
  EXPECT_FALSE(b.prompt_texts[0].has_value());

  // lm-evaluation-harness sends token-id lists, one per request.
  OpenAiRequest c;
  ASSERT_EQ(
      CompletionError(Body({{"prompt", {{5, 6}, {7}, "x"}}, {"n", 2}}), c), "");
  ASSERT_EQ(c.prompts.size(), 3u);
  EXPECT_EQ(c.prompts[1], (std::vector<int64_t>{7}));
  const std::vector<GenerateParams> params = ChoiceParams(c);
  ASSERT_EQ(params.size(), 6u);
  EXPECT_EQ(params[2].prompt, (std::vector<int64_t>{7}));
  EXPECT_EQ(params[3].prompt, (std::vector<int64_t>{7}));
  // The two samples of a prompt are drawn with different seeds, the same
  // for every prompt.
  EXPECT_NE(params[2].sampling.seed(), params[3].sampling.seed());
  EXPECT_EQ(params[0].sampling.seed(), params[2].sampling.seed());
  EXPECT_EQ(params[1].sampling.seed(), params[3].sampling.seed());
}

TEST_F(OpenAiTest, SeedIsKeptAndAbsentSeedsDiffer) {
  OpenAiRequest a;
  ASSERT_EQ(CompletionError(Body({{"prompt", "x"}, {"seed", 1234}}), a), "");
  EXPECT_EQ(a.base.sampling.seed(), 1234u);
  OpenAiRequest b;
  OpenAiRequest c;
  ASSERT_EQ(CompletionError(Body({{"prompt", "x"}}), b), "");
  ASSERT_EQ(CompletionError(Body({{"prompt", "x"}}), c), "");
  EXPECT_NE(b.base.sampling.seed(), c.base.sampling.seed());
}

TEST_F(OpenAiTest, EchoAndLogprobsAsLmEvaluationHarnessSendsThem) {
  OpenAiRequest r;
  ASSERT_EQ(CompletionError(Body({{"prompt", {{5, 6, 7}}},
                                  {"max_tokens", 1},
                                  {"logprobs", 1},
                                  {"echo", true},
                                  {"temperature", 0},
                                  {"seed", 1234}}),
                            r),
            "");
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.logprobs, 1);
  // The prompt's log-probabilities come with echo + logprobs.
  EXPECT_EQ(r.prompt_logprobs, 1);
  EXPECT_FALSE(r.prompt_only);
  OpenAiRequest zero;
  ASSERT_EQ(CompletionError(Body({{"prompt", "x"},
                                  {"max_tokens", 0},
                                  {"logprobs", 0},
                                  {"echo", true}}),
                            zero),
            "");
  EXPECT_TRUE(zero.prompt_only);
  EXPECT_EQ(zero.base.max_new_tokens, 1);
}

TEST_F(OpenAiTest, ChatLogprobsNeedLogprobsTrue) {
  const json messages = {{{"role", "user"}, {"content", "hi"}}};
  OpenAiRequest a;
  EXPECT_EQ(ChatError(Body({{"messages", messages}, {"top_logprobs", 2}}), a),
            "top_logprobs");
  OpenAiRequest b;
  EXPECT_EQ(ChatError(Body({{"messages", messages},
                            {"logprobs", true},
                            {"top_logprobs", 21}}),
                      b),
            "top_logprobs");
  OpenAiRequest c;
  ASSERT_EQ(ChatError(Body({{"messages", messages},
                            {"logprobs", true},
                            {"top_logprobs", 3}}),
                      c),
            "");
  EXPECT_EQ(c.logprobs, 3);
}

TEST_F(OpenAiTest, MessagesAndToolsAreChecked) {
  const json tool = {{"type", "function"},
                     {"function",
                      {{"name", "get_weather"},
                       {"parameters",
                        {{"type", "object"},
                         {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  const json user = {{"role", "user"}, {"content", "hi"}};
  const std::vector<std::pair<json, std::string>> cases = {
      {Body({{"messages", {{{"role", "robot"}}}}}), "messages[0].role"},
      {Body({{"messages", {{{"role", "user"}, {"content", 5}}}}}),
       "messages[0].content"},
      {Body({{"messages",
              {{{"role", "user"},
                {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}),
       "messages[0].content[0]"},
      {Body({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}),
       "messages[0].tool_call_id"},
      {Body({{"messages",
              {user,
               {{"role", "assistant"},
                {"tool_calls", {{{"function", {{"arguments", "{}"}}}}}}}}}}),
       "messages[1].tool_calls[0].function.name"},
      {Body({{"messages", {user}}, {"tools", {{{"type", "web"}}}}}),
       "tools[0].type"},
      {Body({{"messages", {user}}, {"tools", {tool, tool}}}),
       "tools[1].function.name"},
      {Body({{"messages", {user}}, {"tool_choice", "required"}}),
       "tool_choice"},
      {Body({{"messages", {user}},
             {"tools", {tool}},
             {"tool_choice",
              {{"type", "function"}, {"function", {{"name", "other"}}}}}}),
       "tool_choice.function.name"},
      {Body({{"messages", {user}}, {"reasoning_effort", "extreme"}}),
       "reasoning_effort"},
      {Body({{"messages", {user}},
             {"chat_template_kwargs", {{"thinking", "yes"}}}}),
       "chat_template_kwargs.thinking"},
  };
  for (const auto& [body, param] : cases) {
    OpenAiRequest request;
    EXPECT_EQ(ChatError(body, request), param) << body.dump();
  }
}

TEST_F(OpenAiTest, ToolsAreDeclaredInTheClientsKeyOrder) {
  // "name" after "parameters": the prompt keeps that order.
  const std::string raw =
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": "function", "function": {"parameters":
          {"type": "object", "properties": {"b": {"type": "integer"},
          "a": {"type": "string"}}}, "name": "f"}}]})";
  const json body = json::parse(raw);
  OpenAiRequest request;
  ASSERT_FALSE(ParseOpenAiCommon(body, "m", true, request).has_value());
  std::optional<HttpError> e =
      ParseChat(body, *template_, *tokenizer_, json::object(), raw, request);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(request.chat_request.render.tool_functions.size(), 1u);
  const std::string& fn = request.chat_request.render.tool_functions[0];
  EXPECT_LT(fn.find("parameters"), fn.find("name")) << fn;
  EXPECT_LT(fn.find("\"b\""), fn.find("\"a\"")) << fn;
  EXPECT_EQ(request.chat_request.tool_types["f"]["b"], "integer");
  EXPECT_EQ(request.chat_request.tool_choice, ToolChoice::kAuto);
  const std::string prompt =
      tokenizer_->Decode(request.prompts[0], text::SkipSpecialTokens::kNo);
  EXPECT_THAT(prompt, HasSubstr("## Tools"));
}

// A tool schema nested 100k levels deep once overflowed the stack when the
// tool was rendered (dump() recurses once per level): found by
// tests/fuzz/openai_request_fuzzer.cc. It is refused, naming the tool.
TEST_F(OpenAiTest, DeeplyNestedToolIsRefused) {
  constexpr int kDeep = 100000;
  const std::string raw = absl::StrCat(
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": "function", "function": {"name": "f",
          "parameters": {"type": "object", "x": )",
      std::string(kDeep, '['), std::string(kDeep, ']'), "}}}]}");
  const json body = json::parse(raw, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(body.is_discarded());
  OpenAiRequest request;
  ASSERT_FALSE(ParseOpenAiCommon(body, "m", true, request).has_value());
  std::optional<HttpError> e =
      ParseChat(body, *template_, *tokenizer_, json::object(), raw, request);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "tools[0].function");
  EXPECT_THAT(e->message, HasSubstr("deeper than the limit of 128"));
}

// The function object itself is one level: kMaxJsonDepth levels in all are
// accepted, one more is not.
TEST_F(OpenAiTest, ToolNestingLimitIsExact) {
  const auto function = [](int depth) {
    const int arrays = depth - 1;
    return nlohmann::ordered_json::parse(
        absl::StrCat(R"({"name": "f", "x": )", std::string(arrays, '['),
                     std::string(arrays, ']'), "}"));
  };
  ChatRequest at_limit;
  EXPECT_TRUE(AddChatTool(function(kMaxJsonDepth), "fn", at_limit).ok());
  ChatRequest past_limit;
  const absl::Status st =
      AddChatTool(function(kMaxJsonDepth + 1), "fn", past_limit);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvalidFieldName(st), "fn");
  EXPECT_TRUE(past_limit.render.tool_functions.empty());
}

TEST_F(OpenAiTest, ReasoningSettingsAndTheirPrecedence) {
  const json messages = {{{"role", "user"}, {"content", "hi"}}};
  auto thinking = [&](const json& fields, const json& defaults) {
    OpenAiRequest r;
    json body = Body({{"messages", messages}});
    body.update(fields);
    EXPECT_EQ(ChatError(body, r, defaults), "") << body.dump();
    return r.chat_request.thinking;
  };
  // Chat mode unless asked for.
  EXPECT_FALSE(thinking(json::object(), json::object()));
  EXPECT_TRUE(thinking({{"chat_template_kwargs", {{"thinking", true}}}},
                       json::object()));
  // The server's default, and the request over it.
  EXPECT_TRUE(thinking(json::object(), {{"thinking", true}}));
  EXPECT_FALSE(thinking({{"chat_template_kwargs", {{"thinking", false}}}},
                        {{"thinking", true}}));
  // An effort asked for thinks; "none" does not.
  EXPECT_TRUE(thinking({{"reasoning_effort", "high"}}, json::object()));
  EXPECT_FALSE(thinking({{"reasoning_effort", "none"}}, {{"thinking", true}}));
  // The prompt ends in <think> when thinking.
  OpenAiRequest r;
  ASSERT_EQ(ChatError(Body({{"messages", messages},
                            {"chat_template_kwargs", {{"thinking", true}}}}),
                      r),
            "");
  const std::string prompt =
      tokenizer_->Decode(r.prompts[0], text::SkipSpecialTokens::kNo);
  EXPECT_TRUE(prompt.ends_with("<think>")) << prompt;
}

TEST_F(OpenAiTest, DefaultKwargsAreChecked) {
  EXPECT_TRUE(CheckDefaultChatTemplateKwargs({{"thinking", true}}).ok());
  EXPECT_TRUE(
      CheckDefaultChatTemplateKwargs({{"reasoning_effort", "low"}}).ok());
  EXPECT_FALSE(CheckDefaultChatTemplateKwargs({{"thinking", 1}}).ok());
  EXPECT_FALSE(CheckDefaultChatTemplateKwargs({{"thinkng", true}}).ok());
  EXPECT_FALSE(CheckDefaultChatTemplateKwargs(json::array()).ok());
}

TEST_F(OpenAiTest, ForcedToolCallOpensTheAnswer) {
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  OpenAiRequest r;
  ASSERT_EQ(
      ChatError(Body({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                      {"tools", {tool}},
                      {"tool_choice",
                       {{"type", "function"}, {"function", {{"name", "f"}}}}}}),
                r),
      "");
  EXPECT_EQ(r.chat_request.tool_choice, ToolChoice::kNamed);
  const std::string prompt =
      tokenizer_->Decode(r.prompts[0], text::SkipSpecialTokens::kNo);
  EXPECT_TRUE(prompt.ends_with(r.chat_request.forced_prefix)) << prompt;
  EXPECT_THAT(r.chat_request.forced_prefix, HasSubstr("invoke name=\"f\">"));

  // The model continues with the parameters; the choice reports the call.
  ChoiceOutput out(r, 0, *tokenizer_, 7);
  const std::vector<int64_t> ids = Ids(
      "<｜DSML｜parameter name=\"q\" string=\"true\">hi</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  (void)out.Add(ids, std::vector<float>(ids.size(), -0.5f), {});
  (void)out.Finish(GenerateEnd::kStop);
  const json whole = out.Whole();
  ASSERT_EQ(whole["message"]["tool_calls"].size(), 1u) << whole.dump();
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(
      json::parse(whole["message"]["tool_calls"][0]["function"]["arguments"]
                      .get<std::string>()),
      json({{"q", "hi"}}));
  EXPECT_EQ(whole["finish_reason"], "tool_calls");
}

TEST_F(OpenAiTest, ChatChoiceSplitsReasoningContentAndToolCalls) {
  const json tool = {{"type", "function"}, {"function", {{"name", "get"}}}};
  OpenAiRequest r;
  ASSERT_EQ(
      ChatError(Body({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                      {"tools", {tool}},
                      {"chat_template_kwargs", {{"thinking", true}}},
                      {"stream", true}}),
                r),
      "");
  const std::string text =
      "Let me look.</think>Checking.\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"get\">\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const std::vector<int64_t> ids = Ids(text);
  ChoiceOutput out(r, 0, *tokenizer_, 1);
  // Streamed a token at a time: the deltas add up to the whole.
  std::string reasoning;
  std::string content;
  std::string arguments;
  std::string name;
  for (int64_t id : ids) {
    const int64_t one[] = {id};
    const float lp[] = {-1.0f};
    if (std::optional<json> c = out.Add(one, lp, {})) {
      const json& d = (*c)["delta"];
      reasoning += d.value("reasoning_content", std::string());
      content += d.value("content", std::string());
      for (const json& call : d.value("tool_calls", json::array())) {
        EXPECT_EQ(call["index"], 0);
        if (call.contains("id")) name = call["function"]["name"];
        arguments += call["function"].value("arguments", std::string());
      }
    }
  }
  std::vector<json> last = out.Finish(GenerateEnd::kStop);
  ASSERT_FALSE(last.empty());
  EXPECT_EQ(last.back()["finish_reason"], "tool_calls");
  EXPECT_EQ(reasoning, "Let me look.");
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(name, "get");
  EXPECT_EQ(json::parse(arguments), json({{"n", 3}}));
  const json whole = out.Whole();
  EXPECT_EQ(whole["message"]["reasoning_content"], "Let me look.");
  EXPECT_EQ(whole["message"]["content"], "Checking.");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["type"], "function");
  EXPECT_THAT(whole["message"]["tool_calls"][0]["id"].get<std::string>(),
              ::testing::StartsWith("call_"));
}

TEST_F(OpenAiTest, CompletionEchoLogprobsHaveThePromptFirst) {
  OpenAiRequest r;
  ASSERT_EQ(CompletionError(Body({{"prompt", {{5, 6, 7}}},
                                  {"max_tokens", 1},
                                  {"logprobs", 1},
                                  {"echo", true}}),
                            r),
            "");
  ChoiceOutput out(r, 0, *tokenizer_, 0);
  out.SetPrompt(r.prompts[0], r.prompt_texts[0]);
  std::vector<TokenLogprobs> positions(3);
  for (int i = 0; i < 3; ++i) positions[i].token_id = 5 + i;
  positions[1].logprob = -1.5f;
  positions[1].top = {{9}, {-0.25f}};
  positions[2].logprob = -2.5f;
  positions[2].top = {{7}, {-2.5f}};
  out.AddPromptPositions(positions);
  const int64_t gen[] = {8};
  const float gen_lp[] = {-0.75f};
  const TopLogprobs gen_top[] = {{{8}, {-0.75f}}};
  (void)out.Add(gen, gen_lp, gen_top);
  (void)out.Finish(GenerateEnd::kLength);
  const json choice = out.Whole();
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u) << choice.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -1.5);
  EXPECT_EQ(lp["token_logprobs"][3], -0.75);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  // The chosen token and the top one.
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u);
  // The chosen token is the top one: one entry, the same number.
  EXPECT_EQ(lp["top_logprobs"][2].size(), 1u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(choice["finish_reason"], "length");
  const std::string prompt_text =
      tokenizer_->Decode(r.prompts[0], text::SkipSpecialTokens::kNo);
  EXPECT_TRUE(choice["text"].get<std::string>().starts_with(prompt_text));
  const json& prompt_lp = choice["prompt_logprobs"];
  ASSERT_EQ(prompt_lp.size(), 3u);
  EXPECT_TRUE(prompt_lp[0].is_null());
  EXPECT_EQ(prompt_lp[1]["6"]["logprob"], -1.5);
  EXPECT_EQ(prompt_lp[1]["9"]["rank"], 1);
}

TEST_F(OpenAiTest, ChatLogprobsAreAListWithAlternatives) {
  OpenAiRequest r;
  ASSERT_EQ(
      ChatError(Body({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                      {"logprobs", true},
                      {"top_logprobs", 2}}),
                r),
      "");
  ChoiceOutput out(r, 0, *tokenizer_, 0);
  const int64_t gen[] = {10, 11};
  const float lps[] = {-0.5f, -std::numeric_limits<float>::infinity()};
  const TopLogprobs top[] = {{{10, 12, 13}, {-0.5f, -1.0f, -2.0f}},
                             {{12, 11}, {-0.1f, -50.0f}}};
  (void)out.Add(gen, lps, top);
  (void)out.Finish(GenerateEnd::kLength);
  const json content = out.Whole()["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(content[0]["bytes"].is_array());
  // -inf is written as OpenAI's clients expect a number.
  EXPECT_EQ(content[1]["logprob"], -9999.0);
}

}  // namespace
}  // namespace mneme::coordinator
