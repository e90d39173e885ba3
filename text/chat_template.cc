#include "text/chat_template.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/python_json.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

using ordered_json = nlohmann::ordered_json;

// DeepSeek's spellings, used when the tokenizer has no BOS / EOS and the
// template renders missing tokens as text.
constexpr char kDeepSeekBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kDeepSeekEos[] = "<｜end▁of▁sentence｜>";
constexpr char kDsml[] = "｜DSML｜";

// The V4 effort texts (encoding_dsv4.py): preview "max" and 0731 "high" are
// "Absolute maximum"; 0731 "max" is "Beyond maximum" (the dash is U+2014).
constexpr char kEffortAbsoluteMaximum[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose "
    "the problem to resolve the root cause, rigorously stress-testing your "
    "logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every "
    "intermediate step, considered alternative, and rejected hypothesis to "
    "ensure absolutely no assumption is left unchecked.\n\n";
constexpr char kEffortBeyondMaximum[] =
    "Reasoning Effort: Beyond maximum \xE2\x80\x94 exhaustive, relentless, "
    "and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely "
    "nothing to chance: exhaustively decompose the problem into its most "
    "fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution "
    "from multiple angles and are certain that no assumption remains "
    "unchecked and no error remains undiscovered.\n\n";
// V4.1: named levels and the default budget.
constexpr int kV41EffortLow = 50;
constexpr int kV41EffortHigh = 75;
constexpr int kV41EffortMax = 100;
constexpr int kV41EffortDefault = kV41EffortHigh;

constexpr std::array<absl::string_view, 4> kDsparkKeys = {
    "dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id",
    "dspark_target_layer_ids"};

const char* TaskToken(ChatTask task) {
  switch (task) {
    case ChatTask::kNone:
      return "";
    case ChatTask::kAction:
      return "<｜action｜>";
    case ChatTask::kQuery:
      return "<｜query｜>";
    case ChatTask::kAuthority:
      return "<｜authority｜>";
    case ChatTask::kDomain:
      return "<｜domain｜>";
    case ChatTask::kTitle:
      return "<｜title｜>";
    case ChatTask::kReadUrl:
      return "<｜read_url｜>";
  }
  return "";
}

const char* RoleName(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
    case ChatRole::kTool:
      return "tool";
    case ChatRole::kDeveloper:
      return "developer";
    case ChatRole::kLatestReminder:
      return "latest_reminder";
  }
  return "unknown";
}

bool KnownRole(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
    case ChatRole::kUser:
    case ChatRole::kAssistant:
    case ChatRole::kTool:
    case ChatRole::kDeveloper:
    case ChatRole::kLatestReminder:
      return true;
  }
  return false;
}

// The DSML tag names of a format.
struct DsmlTags {
  const char* block;
  const char* invoke;
  const char* parameter;
};

DsmlTags TagsOf(ChatFormat format) {
  if (format == ChatFormat::kV41) return {" calls", " invoke", " parameter"};
  return {"tool_calls", "invoke", "parameter"};
}

// A decimal 1..100 without sign or leading zeros.
std::optional<int> ParseBudget(absl::string_view text) {
  if (text.empty() || text.size() > 3 || text[0] == '0') return std::nullopt;
  int value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > kV41EffortMax) return std::nullopt;
  return value;
}

// The V4.1 budget of an effort ("" is the default).
std::optional<int> V41Budget(absl::string_view effort) {
  if (effort.empty()) return kV41EffortDefault;
  if (effort == "low") return kV41EffortLow;
  if (effort == "high") return kV41EffortHigh;
  if (effort == "max") return kV41EffortMax;
  return ParseBudget(effort);
}

// The text a thinking-mode prompt opens with (after BOS, and for V4.1 after
// <｜System｜>); InvalidArgument for an effort the format does not know.
absl::StatusOr<std::string> EffortText(ChatFormat format,
                                       absl::string_view effort) {
  switch (format) {
    case ChatFormat::kV4Preview: {
      if (effort.empty() || effort == "high") return std::string();
      if (effort == "max") return std::string(kEffortAbsoluteMaximum);
      return absl::InvalidArgumentError(
          absl::StrCat("reasoning_effort '", effort,
                       "' is not one of high, max (DeepSeek-V4 preview)"));
    }
    case ChatFormat::kV4_0731: {
      if (effort.empty() || effort == "low") return std::string();
      if (effort == "high") return std::string(kEffortAbsoluteMaximum);
      if (effort == "max") return std::string(kEffortBeyondMaximum);
      return absl::InvalidArgumentError(
          absl::StrCat("reasoning_effort '", effort,
                       "' is not one of low, high, max (DeepSeek-V4 0731)"));
    }
    case ChatFormat::kV41: {
      const std::optional<int> budget = V41Budget(effort);
      if (!budget) {
        return absl::InvalidArgumentError(
            absl::StrCat("reasoning_effort '", effort,
                         "' is not one of low, high, max or an integer 1..100 "
                         "(DeepSeek-V4.1)"));
      }
      return absl::StrCat("Reasoning Effort: ", *budget,
                          " (range 1-100, the higher the value, the more "
                          "thorough the reasoning)\n\n");
    }
  }
  return absl::InvalidArgumentError("unknown chat format");
}

// One block of a user turn: text, or a tool's result.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_call_id;
};

// A message after tool messages are merged into user turns.
struct Turn {
  ChatRole role = ChatRole::kUser;  // Never kTool.
  std::string content;              // Not for kUser: see blocks.
  std::string reasoning;
  std::string tool_calls_text;  // The DSML block with its "\n\n", or "".
  std::vector<std::string> tool_call_ids;
  std::vector<Block> blocks;  // kUser only.
  ChatTask task = ChatTask::kNone;
  bool declares_tools = false;
};

// The DSML block of an assistant message's calls ("\n\n<｜DSML｜tool_calls>
// ... </｜DSML｜tool_calls>").
absl::StatusOr<std::string> RenderToolCalls(absl::Span<const ToolCall> calls,
                                            const DsmlTags& tags,
                                            size_t message_index) {
  std::vector<std::string> invokes;
  invokes.reserve(calls.size());
  for (size_t j = 0; j < calls.size(); ++j) {
    const ToolCall& call = calls[j];
    const std::string where =
        absl::StrCat("messages[", message_index, "].tool_calls[", j, "]");
    if (call.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".function.name is empty"));
    }
    absl::StatusOr<ordered_json> arguments =
        ParseJsonKeepingKeyOrder(call.arguments);
    if (!arguments.ok() || !arguments->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".function.arguments must be a JSON object",
          arguments.ok()
              ? ""
              : absl::StrCat(" (", arguments.status().message(), ")")));
    }
    std::vector<std::string> parameters;
    for (const auto& [key, value] : arguments->items()) {
      std::string text;
      if (value.is_string()) {
        text = value.get<std::string>();
      } else {
        absl::StatusOr<std::string> dumped = PythonJsonDumps(value);
        if (!dumped.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ".function.arguments: ", dumped.status().message()));
        }
        text = *std::move(dumped);
      }
      parameters.push_back(
          absl::StrCat("<", kDsml, tags.parameter, " name=\"", key,
                       "\" string=\"", value.is_string() ? "true" : "false",
                       "\">", text, "</", kDsml, tags.parameter, ">"));
    }
    invokes.push_back(absl::StrCat(
        "<", kDsml, tags.invoke, " name=\"", call.name, "\">\n",
        absl::StrJoin(parameters, "\n"), "\n</", kDsml, tags.invoke, ">"));
  }
  return absl::StrCat("\n\n<", kDsml, tags.block, ">\n",
                      absl::StrJoin(invokes, "\n"), "\n</", kDsml, tags.block,
                      ">");
}

// TOOLS_TEMPLATE of encoding_dsv4.py with the tools' schemas.
std::string RenderTools(absl::Span<const std::string> schemas,
                        const DsmlTags& tags, const ChatSpecialTokens& tokens) {
  const std::string open = absl::StrCat("<", kDsml);
  const std::string close = absl::StrCat("</", kDsml);
  return absl::StrCat(
      "## Tools\n\n"
      "You have access to a set of tools to help answer the user's question. "
      "You can invoke tools by writing a \"",
      open, tags.block, ">\" block like the following:\n\n", open, tags.block,
      ">\n", open, tags.invoke, " name=\"$TOOL_NAME\">\n", open, tags.parameter,
      absl::StrCat(" name=\"$PARAMETER_NAME\" string=\"true|false\">"
                   "$PARAMETER_VALUE",
                   close, tags.parameter, ">\n...\n", close, tags.invoke, ">\n",
                   open, tags.invoke, " name=\"$TOOL_NAME2\">\n...\n", close,
                   tags.invoke, ">\n", close, tags.block, ">\n\n"),
      "String parameters should be specified as is and set `string=\"true\"`. "
      "For all other types (numbers, booleans, arrays, objects), pass the "
      "value in JSON format and set `string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by ",
      tokens.think_begin,
      absl::StrCat(
          "), you MUST output your complete reasoning inside ",
          tokens.think_begin, "...", tokens.think_end,
          " BEFORE any tool calls or final response.\n\n"
          "Otherwise, output directly after ",
          tokens.think_end,
          " with tool calls or final response.\n\n"
          "### Available Tool Schemas\n\n",
          absl::StrJoin(schemas, "\n"),
          "\n\nYou MUST strictly follow the above defined tool name and "
          "parameter schemas to invoke tool calls.\n"));
}

// Whether a JSON value counts as given (Python truthiness of a dict / list /
// str / number; the reference writes a response format only `if` it is).
bool Truthy(const ordered_json& value) {
  if (value.is_null()) return false;
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_object() || value.is_array() || value.is_string()) {
    return !value.empty() &&
           !(value.is_string() && value.get_ref<const std::string&>().empty());
  }
  if (value.is_number()) return value != 0;
  return true;
}

// find_last_user_index: the last user or developer turn (V4.1: also a system
// message after the first); -1 if none.
int64_t LastUserIndex(absl::Span<const Turn> turns, ChatFormat format) {
  for (int64_t i = static_cast<int64_t>(turns.size()) - 1; i >= 0; --i) {
    const ChatRole role = turns[i].role;
    if (role == ChatRole::kUser || role == ChatRole::kDeveloper ||
        (format == ChatFormat::kV41 && role == ChatRole::kSystem && i > 0)) {
      return i;
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view config_json) {
  JsonParseOptions options;
  options.reject_duplicate_keys = false;
  options.error_code = absl::StatusCode::kInvalidArgument;
  ASSIGN_OR_RETURN(const nlohmann::json config,
                   ParseJsonDocument(absl::string_view(config_json.data(),
                                                       config_json.size()),
                                     "config.json", options));
  if (!config.is_object()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  const auto is_v41 = [](const nlohmann::json& object) {
    const auto it = object.find("model_type");
    return it != object.end() && it->is_string() &&
           it->get_ref<const std::string&>() == "deepseek_v41";
  };
  if (is_v41(config)) return ChatFormat::kV41;
  if (const auto text = config.find("text_config");
      text != config.end() && text->is_object() && is_v41(*text)) {
    return ChatFormat::kV41;
  }
  size_t present = 0;
  for (const absl::string_view key : kDsparkKeys) {
    if (config.contains(std::string(key))) ++present;
  }
  if (present == kDsparkKeys.size()) return ChatFormat::kV4_0731;
  if (present == 0) return ChatFormat::kV4Preview;
  return absl::InvalidArgumentError(
      absl::StrCat("config.json has ", present, " of the ", kDsparkKeys.size(),
                   " dspark_* keys (", absl::StrJoin(kDsparkKeys, ", "),
                   "): neither a DeepSeek-V4 preview nor a 0731 checkpoint"));
}

absl::StatusOr<EffortChoice> NormalizeReasoningEffort(
    ChatFormat format, std::optional<std::string> effort) {
  EffortChoice choice;
  if (effort && *effort == "none") {
    choice.thinking = ThinkingMode::kChat;
    return choice;
  }
  switch (format) {
    case ChatFormat::kV4Preview:
      if (!effort || *effort == "high") {
        choice.reasoning_effort = "high";
      } else if (*effort == "max") {
        choice.reasoning_effort = "max";
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("reasoning_effort '", *effort,
                         "' is not one of none, high, max (DeepSeek-V4 "
                         "preview)"));
      }
      return choice;
    case ChatFormat::kV4_0731:
      if (!effort || *effort == "low") {
        choice.reasoning_effort = "low";
      } else if (*effort == "high" || *effort == "max") {
        choice.reasoning_effort = *effort;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("reasoning_effort '", *effort,
                         "' is not one of none, low, high, max (DeepSeek-V4 "
                         "0731)"));
      }
      return choice;
    case ChatFormat::kV41: {
      // "" is ChatRenderOptions' spelling of the default, not a request's.
      const std::optional<int> budget = effort && effort->empty()
                                            ? std::nullopt
                                            : V41Budget(effort ? *effort : "");
      if (!budget) {
        return absl::InvalidArgumentError(absl::StrCat(
            "reasoning_effort '", *effort,
            "' is not one of none, low, high, max or an integer 1..100 "
            "(DeepSeek-V4.1)"));
      }
      choice.reasoning_effort = absl::StrCat(*budget);
      return choice;
    }
  }
  return absl::InvalidArgumentError("unknown chat format");
}

absl::StatusOr<std::unique_ptr<DeepSeekV4ChatTemplate>>
DeepSeekV4ChatTemplate::Create(const Tokenizer& tokenizer,
                               const ChatTemplateOptions& options) {
  if (options.format != ChatFormat::kV4Preview &&
      options.format != ChatFormat::kV4_0731 &&
      options.format != ChatFormat::kV41) {
    return absl::InvalidArgumentError("options.format is not a ChatFormat");
  }
  ChatSpecialTokens tokens;
  tokens.user = "<｜User｜>";
  tokens.assistant = "<｜Assistant｜>";
  tokens.think_begin = "<think>";
  tokens.think_end = "</think>";
  tokens.system = "<｜System｜>";
  tokens.latest_reminder = "<｜latest_reminder｜>";
  std::vector<std::string> missing;
  if (const std::optional<absl::string_view> bos = tokenizer.bos_token()) {
    tokens.bos = std::string(*bos);
  } else {
    tokens.bos = kDeepSeekBos;
    missing.emplace_back("a BOS token");
  }
  if (const std::optional<absl::string_view> eos = tokenizer.eos_token()) {
    tokens.eos = std::string(*eos);
  } else {
    tokens.eos = kDeepSeekEos;
    missing.emplace_back("an EOS token");
  }
  std::vector<const std::string*> required = {
      &tokens.user, &tokens.assistant, &tokens.think_begin, &tokens.think_end};
  if (options.format == ChatFormat::kV41) required.push_back(&tokens.system);
  for (const std::string* token : required) {
    if (!tokenizer.IsAddedToken(*token)) missing.push_back(*token);
  }
  if (!missing.empty() &&
      options.missing_special_tokens == MissingSpecialTokens::kError) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer lacks the DeepSeek-V4 chat template's special "
        "tokens: ",
        absl::StrJoin(missing, ", ")));
  }
  std::vector<std::string> absent;
  std::vector<std::string> optional_tokens = {tokens.latest_reminder};
  for (const ChatTask task :
       {ChatTask::kAction, ChatTask::kQuery, ChatTask::kAuthority,
        ChatTask::kDomain, ChatTask::kTitle, ChatTask::kReadUrl}) {
    optional_tokens.emplace_back(TaskToken(task));
  }
  for (std::string& token : optional_tokens) {
    if (!tokenizer.IsAddedToken(token)) absent.push_back(std::move(token));
  }
  return std::unique_ptr<DeepSeekV4ChatTemplate>(new DeepSeekV4ChatTemplate(
      tokenizer, std::move(tokens), options, std::move(absent)));
}

absl::Status DeepSeekV4ChatTemplate::CheckOptionalToken(
    const std::string& token) const {
  if (options_.missing_special_tokens == MissingSpecialTokens::kError &&
      std::find(absent_tokens_.begin(), absent_tokens_.end(), token) !=
          absent_tokens_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer lacks the special token ", token));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DeepSeekV4ChatTemplate::Render(
    absl::Span<const ChatMessage> messages,
    const ChatRenderOptions& options) const {
  const ChatFormat format = options_.format;
  const DsmlTags tags = TagsOf(format);
  if (messages.empty()) {
    return absl::InvalidArgumentError("a chat needs at least one message");
  }
  const bool thinking = options.thinking == ThinkingMode::kThinking;
  const bool continue_final =
      options.final_assistant == FinalAssistantMessage::kContinue;
  if (continue_final && messages.back().role != ChatRole::kAssistant) {
    return absl::InvalidArgumentError(
        "continuing the final assistant message needs the conversation to "
        "end with an assistant message");
  }
  ASSIGN_OR_RETURN(const std::string effort_text,
                   EffortText(format, options.reasoning_effort));

  // The declarations: tools, then the response format.
  const bool has_tools = !options.tool_functions.empty();
  std::string declarations;
  if (has_tools) {
    std::vector<std::string> schemas;
    schemas.reserve(options.tool_functions.size());
    for (size_t i = 0; i < options.tool_functions.size(); ++i) {
      absl::StatusOr<ordered_json> function =
          ParseJsonKeepingKeyOrder(options.tool_functions[i]);
      if (!function.ok() || !function->is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tools[", i, "].function must be a JSON object",
            function.ok()
                ? ""
                : absl::StrCat(" (", function.status().message(), ")")));
      }
      absl::StatusOr<std::string> schema = PythonJsonDumps(*function);
      if (!schema.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tools[", i, "].function: ", schema.status().message()));
      }
      schemas.push_back(*std::move(schema));
    }
    absl::StrAppend(&declarations, "\n\n", RenderTools(schemas, tags, tokens_));
  }
  if (options.response_format) {
    absl::StatusOr<ordered_json> value =
        ParseJsonKeepingKeyOrder(*options.response_format);
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("response_format: ", value.status().message()));
    }
    if (Truthy(*value)) {
      absl::StatusOr<std::string> schema = PythonJsonDumps(*value);
      if (!schema.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("response_format: ", schema.status().message()));
      }
      absl::StrAppend(&declarations,
                      "\n\n## Response Format:\n\nYou MUST strictly adhere to "
                      "the following schema to reply:\n",
                      *schema);
    }
  }
  // Which message declares them; nullopt: an empty system message put first.
  std::optional<size_t> declaring;
  if (!declarations.empty()) {
    if (options.tools_message_index) {
      const size_t i = *options.tools_message_index;
      if (i >= messages.size() || (messages[i].role != ChatRole::kSystem &&
                                   messages[i].role != ChatRole::kDeveloper)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tools_message_index ", i,
                         " is not the index of a system or developer message"));
      }
      declaring = i;
    } else if (format == ChatFormat::kV41) {
      for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role == ChatRole::kSystem) {
          declaring = i;
          break;
        }
      }
    } else if (messages[0].role == ChatRole::kSystem ||
               messages[0].role == ChatRole::kDeveloper) {
      declaring = 0;
    }
  }

  // Validate, and merge tool messages into user turns (merge_tool_messages).
  std::vector<Turn> turns;
  turns.reserve(messages.size() + 1);
  if (!declarations.empty() && !declaring) {
    Turn system;
    system.role = ChatRole::kSystem;
    system.declares_tools = true;
    turns.push_back(std::move(system));
  }
  // The latest assistant message: its index and its calls' ids.
  std::optional<size_t> last_assistant;
  std::vector<std::string> last_assistant_ids;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string where = absl::StrCat("message ", i);
    if (!KnownRole(m.role)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown role ", static_cast<int>(m.role)));
    }
    const char* role = RoleName(m.role);
    if (m.role != ChatRole::kAssistant && !m.reasoning_content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " (", role,
                       "): only assistant messages have "
                       "reasoning_content"));
    }
    if (m.role != ChatRole::kAssistant && !m.tool_calls.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (", role, "): only assistant messages have tool_calls"));
    }
    if (m.role != ChatRole::kTool && !m.tool_call_id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (", role, "): only tool messages have tool_call_id"));
    }
    if (m.task != ChatTask::kNone) {
      if (m.role != ChatRole::kUser && m.role != ChatRole::kDeveloper) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " (", role,
                         "): only user and developer messages have a "
                         "task"));
      }
      if (TaskToken(m.task)[0] == '\0') {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown task ", static_cast<int>(m.task)));
      }
      RETURN_IF_ERROR(CheckOptionalToken(TaskToken(m.task)));
    }
    switch (m.role) {
      case ChatRole::kTool: {
        if (!last_assistant || last_assistant_ids.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where,
                           " (tool): no assistant message with tool_calls "
                           "precedes it"));
        }
        if (!m.tool_call_id.empty() &&
            std::find(last_assistant_ids.begin(), last_assistant_ids.end(),
                      m.tool_call_id) == last_assistant_ids.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " (tool): tool_call_id '", m.tool_call_id,
              "' is not the id of a tool call of message ", *last_assistant));
        }
        Block block{true, m.content, m.tool_call_id};
        if (!turns.empty() && turns.back().role == ChatRole::kUser) {
          turns.back().blocks.push_back(std::move(block));
        } else {
          Turn turn;
          turn.role = ChatRole::kUser;
          turn.blocks.push_back(std::move(block));
          turns.push_back(std::move(turn));
        }
        break;
      }
      case ChatRole::kUser: {
        Block block{false, m.content, ""};
        if (!turns.empty() && turns.back().role == ChatRole::kUser &&
            turns.back().task == ChatTask::kNone) {
          turns.back().blocks.push_back(std::move(block));
        } else {
          Turn turn;
          turn.role = ChatRole::kUser;
          turn.task = m.task;
          turn.blocks.push_back(std::move(block));
          turns.push_back(std::move(turn));
        }
        break;
      }
      case ChatRole::kAssistant: {
        Turn turn;
        turn.role = ChatRole::kAssistant;
        turn.content = m.content;
        turn.reasoning = m.reasoning_content;
        if (!m.tool_calls.empty()) {
          ASSIGN_OR_RETURN(turn.tool_calls_text,
                           RenderToolCalls(m.tool_calls, tags, i));
          // Ids are what tool results are matched and ordered by; an
          // assistant message with calls but no ids still takes results.
          last_assistant_ids.clear();
          for (const ToolCall& call : m.tool_calls) {
            last_assistant_ids.push_back(call.id);
          }
          turn.tool_call_ids = last_assistant_ids;
        } else {
          last_assistant_ids.clear();
        }
        last_assistant = i;
        turns.push_back(std::move(turn));
        break;
      }
      case ChatRole::kDeveloper:
        if (m.content.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, " (developer): content is empty"));
        }
        [[fallthrough]];
      case ChatRole::kSystem:
      case ChatRole::kLatestReminder: {
        if (m.role == ChatRole::kLatestReminder) {
          RETURN_IF_ERROR(CheckOptionalToken(tokens_.latest_reminder));
        }
        Turn turn;
        turn.role = m.role;
        turn.content = m.content;
        turn.task = m.task;
        turn.declares_tools = declaring && *declaring == i;
        turns.push_back(std::move(turn));
        break;
      }
    }
  }

  // Tool results in the order of the calls (sort_tool_results_by_call_order:
  // by the position of their id among the latest calls; unknown or no id
  // counts as the first; stable).
  std::map<std::string, size_t, std::less<>> call_order;
  for (Turn& turn : turns) {
    if (turn.role == ChatRole::kAssistant && !turn.tool_call_ids.empty()) {
      call_order.clear();
      for (size_t j = 0; j < turn.tool_call_ids.size(); ++j) {
        if (!turn.tool_call_ids[j].empty()) {
          // A repeated id ranks where it last appears, as in the reference.
          call_order[turn.tool_call_ids[j]] = j;
        }
      }
    } else if (turn.role == ChatRole::kUser && !call_order.empty()) {
      std::vector<Block> results;
      for (const Block& block : turn.blocks) {
        if (block.tool_result) results.push_back(block);
      }
      if (results.size() < 2) continue;
      const auto rank = [&call_order](const Block& block) {
        const auto it = call_order.find(block.tool_call_id);
        return it == call_order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&rank](const Block& a, const Block& b) {
                         return rank(a) < rank(b);
                       });
      size_t next = 0;
      for (Block& block : turn.blocks) {
        if (block.tool_result) block = std::move(results[next++]);
      }
    }
  }

  // Earlier reasoning (_drop_thinking_messages): tools keep it all.
  const bool drop =
      options.earlier_reasoning == EarlierReasoning::kDrop && !has_tools;
  if (thinking && drop) {
    const int64_t last_user = LastUserIndex(turns, format);
    std::vector<Turn> kept;
    kept.reserve(turns.size());
    for (size_t i = 0; i < turns.size(); ++i) {
      Turn& turn = turns[i];
      const bool later = static_cast<int64_t>(i) >= last_user;
      if (turn.role == ChatRole::kDeveloper && !later) continue;
      if (turn.role == ChatRole::kAssistant && !later) turn.reasoning.clear();
      kept.push_back(std::move(turn));
    }
    turns = std::move(kept);
  }

  const int64_t last_user = LastUserIndex(turns, format);
  std::string prompt;
  if (options.bos == BosToken::kAdd) prompt = tokens_.bos;
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& turn = turns[i];
    const auto index = static_cast<int64_t>(i);
    const bool last = i + 1 == turns.size();
    if (i == 0) {
      if (format == ChatFormat::kV41) {
        if (thinking || turn.role == ChatRole::kSystem) {
          prompt += tokens_.system;
        }
        if (thinking) prompt += effort_text;
      } else if (thinking) {
        prompt += effort_text;
      }
    }
    switch (turn.role) {
      case ChatRole::kSystem:
        if (format == ChatFormat::kV41 && i > 0) prompt += tokens_.system;
        prompt += turn.content;
        if (turn.declares_tools) prompt += declarations;
        break;
      case ChatRole::kDeveloper:
        absl::StrAppend(&prompt, tokens_.user, turn.content);
        if (turn.declares_tools) prompt += declarations;
        break;
      case ChatRole::kUser: {
        prompt += tokens_.user;
        for (size_t b = 0; b < turn.blocks.size(); ++b) {
          const Block& block = turn.blocks[b];
          if (b > 0) prompt += "\n\n";
          if (block.tool_result) {
            absl::StrAppend(&prompt, "<tool_result>", block.text,
                            "</tool_result>");
          } else {
            prompt += block.text;
          }
        }
        break;
      }
      case ChatRole::kLatestReminder:
        absl::StrAppend(&prompt, tokens_.latest_reminder, turn.content);
        break;
      case ChatRole::kAssistant: {
        const bool after_task = i > 0 && turns[i - 1].task != ChatTask::kNone;
        const bool continued = last && continue_final;
        if (thinking && !after_task && (!drop || index > last_user)) {
          // V4.1 continues a reasoning-only final message inside its
          // reasoning.
          if (continued && format == ChatFormat::kV41 &&
              !turn.reasoning.empty() && turn.content.empty() &&
              turn.tool_calls_text.empty()) {
            prompt += turn.reasoning;
          } else {
            absl::StrAppend(&prompt, turn.reasoning, tokens_.think_end);
          }
        }
        absl::StrAppend(&prompt, turn.content, turn.tool_calls_text);
        if (!continued) prompt += tokens_.eos;
        break;
      }
      case ChatRole::kTool:
        return absl::InternalError("a tool message was not merged");
    }
    // The answer opens after a turn that an assistant message or a latest
    // reminder follows, or that ends the conversation.
    if (!last && turns[i + 1].role != ChatRole::kAssistant &&
        turns[i + 1].role != ChatRole::kLatestReminder) {
      continue;
    }
    const bool think = thinking && (!drop || index >= last_user);
    if (turn.task != ChatTask::kNone) {
      if (turn.task == ChatTask::kAction) {
        absl::StrAppend(&prompt, tokens_.assistant,
                        thinking ? tokens_.think_begin : tokens_.think_end);
      }
      prompt += TaskToken(turn.task);
    } else if (turn.role == ChatRole::kUser ||
               turn.role == ChatRole::kDeveloper ||
               (format == ChatFormat::kV41 && turn.role == ChatRole::kSystem &&
                i > 0)) {
      absl::StrAppend(&prompt, tokens_.assistant,
                      think ? tokens_.think_begin : tokens_.think_end);
    }
  }
  return prompt;
}

absl::StatusOr<std::vector<int64_t>> DeepSeekV4ChatTemplate::Encode(
    absl::Span<const ChatMessage> messages,
    const ChatRenderOptions& options) const {
  ASSIGN_OR_RETURN(std::string prompt, Render(messages, options));
  return tokenizer_.Encode(prompt, AddSpecialTokens::kNo);
}

}  // namespace mneme::text
