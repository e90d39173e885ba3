#include "services/coordinator/chat_request.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "services/coordinator/request_validator.h"

namespace mneme::coordinator {
namespace {

// The JSON-schema type of each parameter of a tool's `parameters`.
std::map<std::string, std::string> ParameterTypes(
    const nlohmann::ordered_json& function) {
  std::map<std::string, std::string> types;
  auto params = function.find("parameters");
  if (params == function.end() || !params->is_object()) return types;
  auto props = params->find("properties");
  if (props == params->end() || !props->is_object()) return types;
  for (auto p = props->begin(); p != props->end(); ++p) {
    if (!p.value().is_object()) continue;
    auto type = p.value().find("type");
    if (type != p.value().end() && type->is_string()) {
      types[p.key()] = type->get<std::string>();
    }
  }
  return types;
}

// Whether `value` nests arrays / objects more than `limit` levels deep.
// Recurses at most limit + 1 levels, however deep `value` is.
bool NestsDeeperThan(const nlohmann::ordered_json& value, int limit) {
  if (!value.is_structured()) return false;
  if (limit == 0) return true;
  for (const nlohmann::ordered_json& child : value) {
    if (NestsDeeperThan(child, limit - 1)) return true;
  }
  return false;
}

}  // namespace

absl::Status AddChatTool(const nlohmann::ordered_json& function,
                         const std::string& field, ChatRequest& chat) {
  if (!function.is_object())
    return InvalidFieldError(field, "must be an object");
  if (chat.render.tool_functions.size() >= kMaxTools) {
    return InvalidFieldError(
        field, absl::StrCat("is past the limit of ", kMaxTools, " tools"));
  }
  auto name = function.find("name");
  if (name == function.end() || !name->is_string() ||
      name->get<std::string>().empty()) {
    return InvalidFieldError(field + ".name", "is required (a string)");
  }
  if (auto params = function.find("parameters");
      params != function.end() && !params->is_null() && !params->is_object()) {
    return InvalidFieldError(field + ".parameters", "must be an object");
  }
  // dump() below recurses once per level: a schema nested 100k deep would
  // overflow the stack.
  if (NestsDeeperThan(function, kMaxJsonDepth)) {
    return InvalidFieldError(
        field, absl::StrCat("nests arrays / objects deeper than the limit of ",
                            kMaxJsonDepth));
  }
  const std::string n = name->get<std::string>();
  if (chat.tool_types.contains(n)) {
    return InvalidFieldError(field + ".name",
                             absl::StrCat("'", n, "' is declared twice"));
  }
  chat.render.tool_functions.push_back(function.dump());
  chat.tool_types[n] = ParameterTypes(function);
  return absl::OkStatus();
}

absl::Status SetToolChoice(ToolChoice choice, const std::string& name,
                           const std::string& choice_field,
                           const std::string& name_field, ChatRequest& chat) {
  const bool has_tools = !chat.render.tool_functions.empty();
  chat.forced_tool.clear();
  switch (choice) {
    case ToolChoice::kNone:
      break;
    case ToolChoice::kAuto:
      if (!has_tools) choice = ToolChoice::kNone;
      break;
    case ToolChoice::kRequired:
      if (!has_tools) {
        return InvalidFieldError(choice_field,
                                 "is \"required\" but no tools are given");
      }
      break;
    case ToolChoice::kNamed:
      if (!chat.tool_types.contains(name)) {
        return InvalidFieldError(
            name_field, absl::StrCat("'", name, "' is not one of the tools"));
      }
      chat.forced_tool = name;
      break;
  }
  chat.tool_choice = choice;
  return absl::OkStatus();
}

absl::Status SetReasoning(text::ChatFormat format, bool thinking,
                          const std::optional<std::string>& effort,
                          const std::string& effort_field, ChatRequest& chat) {
  if (effort.has_value() && *effort == "none") thinking = false;
  chat.thinking = thinking;
  chat.render.reasoning_effort.clear();
  if (!thinking) {
    chat.render.thinking = text::ThinkingMode::kChat;
    return absl::OkStatus();
  }
  absl::StatusOr<text::EffortChoice> normalized =
      text::NormalizeReasoningEffort(format, effort);
  if (!normalized.ok()) {
    return InvalidFieldError(effort_field, normalized.status().message());
  }
  chat.thinking = normalized->thinking == text::ThinkingMode::kThinking;
  chat.render.thinking = normalized->thinking;
  chat.render.reasoning_effort = normalized->reasoning_effort;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> RenderChatPrompt(
    const text::DeepSeekV4ChatTemplate& tmpl, const text::Tokenizer& tokenizer,
    const std::string& messages_field, ChatRequest& chat) {
  const bool v41 = tmpl.format() == text::ChatFormat::kV41;
  chat.v41 = v41;
  chat.forced_prefix.clear();
  if (chat.tool_choice == ToolChoice::kNone) {
    // Tools are not offered: the prompt does not declare them and the
    // output is plain text.
    chat.render.tool_functions.clear();
    chat.tool_types.clear();
  }
  if (chat.tool_choice == ToolChoice::kRequired ||
      chat.tool_choice == ToolChoice::kNamed) {
    // A forced call: the answer starts with the call's opening, written in
    // the prompt; thinking is skipped (the call comes first).
    chat.thinking = false;
    chat.render.thinking = text::ThinkingMode::kChat;
    const std::string block = v41 ? "<｜DSML｜ calls>" : "<｜DSML｜tool_calls>";
    const std::string invoke =
        v41 ? "<｜DSML｜ invoke name=\"" : "<｜DSML｜invoke name=\"";
    chat.forced_prefix = absl::StrCat("\n\n", block, "\n", invoke);
    if (chat.tool_choice == ToolChoice::kNamed) {
      absl::StrAppend(&chat.forced_prefix, chat.forced_tool, "\">\n");
    }
  }
  ASSIGN_OR_RETURN(std::string text, tmpl.Render(chat.messages, chat.render));
  absl::StatusOr<std::vector<int64_t>> ids =
      tokenizer.Encode(text + chat.forced_prefix, text::AddSpecialTokens::kNo);
  if (!ids.ok()) {
    return InvalidFieldError(messages_field, ids.status().message());
  }
  return ids;
}

text::ChatOutputParserOptions ChatParserOptions(const ChatRequest& chat,
                                                uint64_t id_seed) {
  text::ChatOutputParserOptions options;
  options.dialect = chat.v41 ? text::DsmlDialect::kV41 : text::DsmlDialect::kV4;
  options.thinking = chat.thinking;
  options.tools_enabled = chat.tool_choice != ToolChoice::kNone;
  options.parameter_types = chat.tool_types;
  options.id_seed = id_seed;
  return options;
}

}  // namespace mneme::coordinator
