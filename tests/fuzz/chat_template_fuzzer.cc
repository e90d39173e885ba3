// libFuzzer target for the chat template's input and the model output
// parser. The input is a conversation, one item per line:
//   first line    option letters: t (thinking), k (keep earlier reasoning),
//                 c (continue the final assistant message), 1 (V4.1 format),
//                 p (V4 preview format)
//   s/u/a/d/l/t<text>  a system / user / assistant / developer /
//                 latest-reminder / tool message
//   r<text>       reasoning_content of the last message
//   c<name> <arguments JSON>  a tool call of the last message
//   i<id>         tool_call_id of the last message
//   f<JSON>       a tool function schema
//   j<JSON>       the response_format
// DeepSeekV4ChatTemplate::Render must render or refuse with a status; the
// whole input is then streamed through a ChatOutputParser in chunks.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "text/chat_output_parser.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

using ::mneme::text::ChatFormat;
using ::mneme::text::ChatMessage;
using ::mneme::text::ChatRenderOptions;
using ::mneme::text::ChatRole;
using ::mneme::text::ChatTemplateOptions;
using ::mneme::text::DeepSeekV4ChatTemplate;
using ::mneme::text::Tokenizer;

// A small byte-level tokenizer; the template renders the special tokens it
// lacks as text.
constexpr char kSmallTokenizer[] = R"json({
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}
})json";

// Most messages, tools and calls one input may make (keeps runs fast).
constexpr size_t kMaxItems = 64;

const Tokenizer& SmallTokenizer() {
  static const Tokenizer* const tokenizer = [] {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::FromJson(kSmallTokenizer, {}, "small.json");
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tokenizer;
}

const DeepSeekV4ChatTemplate& Template(ChatFormat format) {
  static const DeepSeekV4ChatTemplate* templates[3] = {};
  const int index = static_cast<int>(format);
  if (templates[index] == nullptr) {
    ChatTemplateOptions options;
    options.format = format;
    options.missing_special_tokens =
        mneme::text::MissingSpecialTokens::kRenderAsText;
    absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>> t =
        DeepSeekV4ChatTemplate::Create(SmallTokenizer(), options);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      std::abort();
    }
    templates[index] = t->release();
  }
  return *templates[index];
}

void RenderConversation(absl::string_view input) {
  std::vector<absl::string_view> lines = absl::StrSplit(input, '\n');
  const absl::string_view flags = lines.front();
  ChatRenderOptions options;
  ChatFormat format = ChatFormat::kV4_0731;
  for (const char c : flags) {
    if (c == 't') options.thinking = mneme::text::ThinkingMode::kThinking;
    if (c == 'k')
      options.earlier_reasoning = mneme::text::EarlierReasoning::kKeep;
    if (c == 'c') {
      options.final_assistant = mneme::text::FinalAssistantMessage::kContinue;
    }
    if (c == '1') format = ChatFormat::kV41;
    if (c == 'p') format = ChatFormat::kV4Preview;
  }
  std::vector<ChatMessage> messages;
  size_t items = 0;
  for (size_t i = 1; i < lines.size() && items < kMaxItems; ++i, ++items) {
    const absl::string_view line = lines[i];
    if (line.empty()) continue;
    const std::string rest(line.substr(1));
    ChatMessage* last = messages.empty() ? nullptr : &messages.back();
    const auto add = [&](ChatRole role) {
      ChatMessage message;
      message.role = role;
      message.content = rest;
      messages.push_back(std::move(message));
    };
    switch (line[0]) {
      case 's':
        add(ChatRole::kSystem);
        break;
      case 'u':
        add(ChatRole::kUser);
        break;
      case 'a':
        add(ChatRole::kAssistant);
        break;
      case 'd':
        add(ChatRole::kDeveloper);
        break;
      case 'l':
        add(ChatRole::kLatestReminder);
        break;
      case 't':
        add(ChatRole::kTool);
        break;
      case 'r':
        if (last != nullptr) last->reasoning_content = rest;
        break;
      case 'i':
        if (last != nullptr) last->tool_call_id = rest;
        break;
      case 'c':
        if (last != nullptr) {
          const size_t space = rest.find(' ');
          mneme::text::ToolCall call;
          call.id = absl::StrCat("call_", items);
          call.name = rest.substr(0, space);
          if (space != std::string::npos)
            call.arguments = rest.substr(space + 1);
          last->tool_calls.push_back(std::move(call));
        }
        break;
      case 'f':
        options.tool_functions.push_back(rest);
        break;
      case 'j':
        options.response_format = rest;
        break;
      default:
        break;
    }
  }
  const absl::StatusOr<std::string> text =
      Template(format).Render(messages, options);
  if (!text.ok() && text.status().message().empty()) {
    std::fprintf(stderr, "refusal without a message\n");
    std::abort();
  }
}

void ParseOutput(absl::string_view input) {
  for (const bool v41 : {false, true}) {
    mneme::text::ChatOutputParserOptions options;
    options.dialect =
        v41 ? mneme::text::DsmlDialect::kV41 : mneme::text::DsmlDialect::kV4;
    options.thinking = !input.empty() && input[0] == 't';
    options.parameter_types["f"] = {{"n", "integer"}, {"o", "object"}};
    mneme::text::ChatOutputParser parser(options);
    // Chunks of 1, 2, 3, ... bytes, as a stream of tokens would cut it.
    size_t chunk = 1;
    for (size_t at = 0; at < input.size(); at += chunk++) {
      (void)parser.Feed(input.substr(at, chunk));
    }
    (void)parser.Finish();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  RenderConversation(input);
  ParseOutput(input);
  return 0;
}
