#include "text/chat_template.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/text/test_tokenizers.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

using ::testing::HasSubstr;

constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kEos[] = "<｜end▁of▁sentence｜>";
constexpr char kUser[] = "<｜User｜>";
constexpr char kAssistant[] = "<｜Assistant｜>";

ChatMessage Message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}
ChatMessage System(std::string content) {
  return Message(ChatRole::kSystem, std::move(content));
}
ChatMessage User(std::string content) {
  return Message(ChatRole::kUser, std::move(content));
}
ChatMessage Assistant(std::string content, std::string reasoning = "") {
  ChatMessage m = Message(ChatRole::kAssistant, std::move(content));
  m.reasoning_content = std::move(reasoning);
  return m;
}

ChatRenderOptions Thinking() {
  ChatRenderOptions options;
  options.thinking = ThinkingMode::kThinking;
  return options;
}

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        LoadTestTokenizer("deepseek_style");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> chat =
        DeepSeekV4ChatTemplate::Create(*tokenizer_);
    ASSERT_TRUE(chat.ok()) << chat.status();
    chat_ = *std::move(chat);
  }

  std::string Render(const std::vector<ChatMessage>& messages,
                     const ChatRenderOptions& options) {
    absl::StatusOr<std::string> prompt = chat_->Render(messages, options);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    return prompt.ok() ? *prompt : "";
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<DeepSeekV4ChatTemplate> chat_;
};

TEST_F(ChatTemplateTest, TakesItsTokensFromTheTokenizer) {
  EXPECT_EQ(chat_->tokens().bos, kBos);
  EXPECT_EQ(chat_->tokens().eos, kEos);
  EXPECT_EQ(chat_->tokens().user, kUser);
  EXPECT_EQ(chat_->tokens().assistant, kAssistant);
  EXPECT_EQ(chat_->tokens().think_begin, "<think>");
  EXPECT_EQ(chat_->tokens().think_end, "</think>");
}

TEST_F(ChatTemplateTest, ChatModeClosesThinking) {
  EXPECT_EQ(
      Render({System("You are a helpful assistant."), User("What is 2+2?")},
             ChatRenderOptions()),
      absl::StrCat(kBos, "You are a helpful assistant.", kUser, "What is 2+2?",
                   kAssistant, "</think>"));
}

TEST_F(ChatTemplateTest, ThinkingModeOpensThinking) {
  EXPECT_EQ(
      Render({System("You are a helpful assistant."), User("What is 2+2?")},
             Thinking()),
      absl::StrCat(kBos, "You are a helpful assistant.", kUser, "What is 2+2?",
                   kAssistant, "<think>"));
}

TEST_F(ChatTemplateTest, MultiTurnThinkingDropsEarlierReasoning) {
  const std::vector<ChatMessage> messages = {
      User("1+1?"), Assistant("2", "one plus one"), User("2+2?")};
  EXPECT_EQ(Render(messages, Thinking()),
            absl::StrCat(kBos, kUser, "1+1?", kAssistant, "</think>", "2", kEos,
                         kUser, "2+2?", kAssistant, "<think>"));
  ChatRenderOptions keep = Thinking();
  keep.earlier_reasoning = EarlierReasoning::kKeep;
  EXPECT_EQ(Render(messages, keep),
            absl::StrCat(kBos, kUser, "1+1?", kAssistant, "<think>",
                         "one plus one</think>2", kEos, kUser, "2+2?",
                         kAssistant, "<think>"));
  // Chat mode never writes reasoning.
  EXPECT_EQ(Render(messages, ChatRenderOptions()),
            absl::StrCat(kBos, kUser, "1+1?", kAssistant, "</think>", "2", kEos,
                         kUser, "2+2?", kAssistant, "</think>"));
}

TEST_F(ChatTemplateTest, AnswerAfterTheLastUserKeepsItsReasoning) {
  EXPECT_EQ(Render({User("Q"), Assistant("A.", "thought")}, Thinking()),
            absl::StrCat(kBos, kUser, "Q", kAssistant, "<think>",
                         "thought</think>A.", kEos));
}

TEST_F(ChatTemplateTest, ContinuesAFinalAssistantMessage) {
  ChatRenderOptions options;
  options.final_assistant = FinalAssistantMessage::kContinue;
  EXPECT_EQ(
      Render({User("Q"), Assistant("The answer is")}, options),
      absl::StrCat(kBos, kUser, "Q", kAssistant, "</think>", "The answer is"));
}

TEST_F(ChatTemplateTest, SystemMessagesAnywhereAndNoBos) {
  ChatRenderOptions options;
  options.bos = BosToken::kOmit;
  EXPECT_EQ(Render({System("S1"), User("U1"), Assistant("A1"), System("S2"),
                    User("U2")},
                   options),
            absl::StrCat("S1", kUser, "U1", kAssistant, "</think>", "A1", kEos,
                         "S2", kUser, "U2", kAssistant, "</think>"));
  // A user message followed by a system message opens no assistant turn.
  EXPECT_EQ(Render({User("U1"), System("S")}, options),
            absl::StrCat(kUser, "U1", "S"));
}

TEST_F(ChatTemplateTest, RejectsBadConversations) {
  EXPECT_EQ(chat_->Render({}, ChatRenderOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ChatMessage user = User("Q");
  user.reasoning_content = "why";
  const absl::Status reasoning_on_user =
      chat_->Render({user}, ChatRenderOptions()).status();
  EXPECT_EQ(reasoning_on_user.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reasoning_on_user.message(), HasSubstr("reasoning_content"));
  ChatRenderOptions options;
  options.final_assistant = FinalAssistantMessage::kContinue;
  EXPECT_EQ(chat_->Render({User("Q")}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ChatTemplateTest, EncodesSpecialTokensAsSingleIds) {
  const std::vector<ChatMessage> messages = {
      System("Be brief."), User("Hello <think> world"), Assistant("Hi!"),
      User("中文🙂")};
  absl::StatusOr<std::vector<int64_t>> ids =
      chat_->Encode(messages, Thinking());
  ASSERT_TRUE(ids.ok()) << ids.status();
  const int64_t bos = *tokenizer_->TokenToId(kBos);
  const int64_t eos = *tokenizer_->TokenToId(kEos);
  const int64_t user = *tokenizer_->TokenToId(kUser);
  const int64_t assistant = *tokenizer_->TokenToId(kAssistant);
  const int64_t think = *tokenizer_->TokenToId("<think>");
  const int64_t think_end = *tokenizer_->TokenToId("</think>");
  ASSERT_FALSE(ids->empty());
  EXPECT_EQ(ids->front(), bos);
  EXPECT_EQ(ids->back(), think);
  const auto count = [&](int64_t id) {
    return std::count(ids->begin(), ids->end(), id);
  };
  EXPECT_EQ(count(bos), 1);
  EXPECT_EQ(count(eos), 1);
  EXPECT_EQ(count(user), 2);
  EXPECT_EQ(count(assistant), 2);
  EXPECT_EQ(count(think_end), 1);
  // "<think>" typed by the user is the token too, as in the reference.
  EXPECT_EQ(count(think), 2);
  absl::StatusOr<std::string> text = chat_->Render(messages, Thinking());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(tokenizer_->Decode(*ids, SkipSpecialTokens::kNo), *text);
  // The BOS is in the text: encoding adds no second one.
  absl::StatusOr<std::vector<int64_t>> plain =
      tokenizer_->Encode(*text, AddSpecialTokens::kNo);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, *ids);
}

// The synthetic tokenizer has BOS / EOS but not the chat tokens, and adding
// them would change its vocabulary.
TEST(ChatTemplateSyntheticTest, NamesMissingTokensOrRendersThemAsText) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadTestTokenizer("synthetic");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> strict =
      DeepSeekV4ChatTemplate::Create(**tokenizer);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(strict.status().message(), HasSubstr("<｜User｜>"));
  EXPECT_THAT(strict.status().message(), HasSubstr("<｜Assistant｜>"));
  EXPECT_THAT(strict.status().message(), HasSubstr("</think>"));
  EXPECT_THAT(strict.status().message(), ::testing::Not(HasSubstr("BOS")));

  ChatTemplateOptions options;
  options.missing_special_tokens = MissingSpecialTokens::kRenderAsText;
  absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> lenient =
      DeepSeekV4ChatTemplate::Create(**tokenizer, options);
  ASSERT_TRUE(lenient.ok()) << lenient.status();
  const std::vector<ChatMessage> messages = {User("hello")};
  absl::StatusOr<std::vector<int64_t>> ids =
      (*lenient)->Encode(messages, ChatRenderOptions());
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), *(*tokenizer)->bos_id());
  EXPECT_EQ((*tokenizer)->Decode(*ids, SkipSpecialTokens::kNo),
            absl::StrCat(kBos, kUser, "hello", kAssistant, "</think>"));
}

}  // namespace
}  // namespace mneme::text
