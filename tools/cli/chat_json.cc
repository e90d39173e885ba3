#include "tools/cli/chat_json.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::cli {
namespace {

namespace sv1 = serving::v1;
using Json = nlohmann::ordered_json;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("'", path, "' ", what));
}

absl::StatusOr<sv1::ChatRole> RoleOf(const std::string& role,
                                     const std::string& path) {
  if (role == "system") return sv1::CHAT_ROLE_SYSTEM;
  if (role == "user") return sv1::CHAT_ROLE_USER;
  if (role == "assistant") return sv1::CHAT_ROLE_ASSISTANT;
  if (role == "tool") return sv1::CHAT_ROLE_TOOL;
  if (role == "developer") return sv1::CHAT_ROLE_DEVELOPER;
  if (role == "latest_reminder") return sv1::CHAT_ROLE_LATEST_REMINDER;
  return Bad(path, absl::StrCat("'", role,
                                "' is not system, user, assistant, tool, "
                                "developer or latest_reminder"));
}

// An optional string member; null and absent are "".
absl::StatusOr<std::string> StringOf(const Json& object, const char* key,
                                     const std::string& path) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Bad(path + "." + key, "must be a string");
  return it->get<std::string>();
}

absl::StatusOr<std::string> ContentOf(const Json& m, const std::string& path) {
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) {
    return Bad(path + ".content", "must be a string or a list of parts");
  }
  std::string out;
  for (size_t i = 0; i < content->size(); ++i) {
    const Json& part = (*content)[i];
    auto type = part.is_object() ? part.find("type") : part.end();
    auto text = part.is_object() ? part.find("text") : part.end();
    if (!part.is_object() || type == part.end() || *type != "text" ||
        text == part.end() || !text->is_string()) {
      return Bad(absl::StrCat(path, ".content[", i, "]"),
                 "must be {\"type\": \"text\", \"text\": ...}");
    }
    out += text->get<std::string>();
  }
  return out;
}

absl::Status ToolCallsOf(const Json& m, const std::string& path,
                         sv1::ChatMessage& out) {
  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return absl::OkStatus();
  if (!calls->is_array()) return Bad(path + ".tool_calls", "must be a list");
  for (size_t i = 0; i < calls->size(); ++i) {
    const Json& c = (*calls)[i];
    const std::string at = absl::StrCat(path, ".tool_calls[", i, "]");
    if (!c.is_object()) return Bad(at, "must be an object");
    sv1::ToolCall* call = out.add_tool_calls();
    ASSIGN_OR_RETURN(*call->mutable_id(), StringOf(c, "id", at));
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) {
      return Bad(at + ".function", "is required (an object)");
    }
    ASSIGN_OR_RETURN(*call->mutable_name(),
                     StringOf(*fn, "name", at + ".function"));
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      call->set_arguments("{}");
    } else if (args->is_string()) {
      call->set_arguments(args->get<std::string>());
    } else if (args->is_object()) {
      call->set_arguments(args->dump());
    } else {
      return Bad(at + ".function.arguments",
                 "must be a JSON object or its text");
    }
  }
  return absl::OkStatus();
}

// A reasoning effort given as a string or an integer.
absl::Status EffortOf(const Json& v, const std::string& path, sv1::Chat& chat) {
  if (v.is_string()) {
    chat.set_reasoning_effort(v.get<std::string>());
  } else if (v.is_number_integer()) {
    chat.set_reasoning_effort(std::to_string(v.get<int64_t>()));
  } else {
    return Bad(path, "must be a string or an integer");
  }
  return absl::OkStatus();
}

absl::Status ToolsOf(const Json& body, sv1::Chat& chat) {
  auto tools = body.find("tools");
  if (tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Bad("tools", "must be a list");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      auto fn = t.is_object() ? t.find("function") : t.end();
      if (!t.is_object() || fn == t.end() || !fn->is_object()) {
        return Bad(at, "must be {\"type\": \"function\", \"function\": {...}}");
      }
      chat.add_tool_functions(fn->dump());
    }
  }
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return absl::OkStatus();
  sv1::ToolChoice* tc = chat.mutable_tool_choice();
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") {
      tc->set_mode(sv1::ToolChoice::MODE_NONE);
    } else if (c == "auto") {
      tc->set_mode(sv1::ToolChoice::MODE_AUTO);
    } else if (c == "required") {
      tc->set_mode(sv1::ToolChoice::MODE_REQUIRED);
    } else {
      return Bad("tool_choice",
                 "must be \"none\", \"auto\", \"required\" or a function");
    }
    return absl::OkStatus();
  }
  auto fn = choice->is_object() ? choice->find("function") : choice->end();
  if (!choice->is_object() || fn == choice->end() || !fn->is_object()) {
    return Bad("tool_choice.function", "is required (an object)");
  }
  tc->set_mode(sv1::ToolChoice::MODE_NAMED);
  ASSIGN_OR_RETURN(*tc->mutable_name(),
                   StringOf(*fn, "name", "tool_choice.function"));
  return absl::OkStatus();
}

absl::Status ReasoningOf(const Json& body, sv1::Chat& chat) {
  if (auto kw = body.find("chat_template_kwargs");
      kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) {
      return Bad("chat_template_kwargs", "must be an object");
    }
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto t = kw->find(key);
      if (t == kw->end() || t->is_null()) continue;
      if (!t->is_boolean()) {
        return Bad(absl::StrCat("chat_template_kwargs.", key),
                   "must be a boolean");
      }
      chat.set_thinking(t->get<bool>());
    }
    if (auto e = kw->find("reasoning_effort");
        e != kw->end() && !e->is_null()) {
      RETURN_IF_ERROR(
          EffortOf(*e, "chat_template_kwargs.reasoning_effort", chat));
    }
  }
  if (auto t = body.find("thinking"); t != body.end() && !t->is_null()) {
    if (!t->is_boolean()) return Bad("thinking", "must be a boolean");
    chat.set_thinking(t->get<bool>());
  }
  if (auto e = body.find("reasoning_effort");
      e != body.end() && !e->is_null()) {
    RETURN_IF_ERROR(EffortOf(*e, "reasoning_effort", chat));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<sv1::Chat> ChatFromOpenAiJson(std::string_view text) {
  if (text.size() > kMaxChatJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chat is larger than ", kMaxChatJsonBytes, " bytes"));
  }
  const Json body = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return absl::InvalidArgumentError("the chat is not valid JSON");
  }
  const Json* messages = &body;
  if (body.is_object()) {
    auto it = body.find("messages");
    if (it == body.end()) {
      return Bad("messages", "is required (a list of messages)");
    }
    messages = &*it;
  }
  if (!messages->is_array()) {
    return Bad("messages", "must be a list of messages");
  }
  sv1::Chat chat;
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string path = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(path, "must be an object");
    sv1::ChatMessage* out = chat.add_messages();
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Bad(path + ".role", "is required (a string)");
    }
    ASSIGN_OR_RETURN(sv1::ChatRole r,
                     RoleOf(role->get<std::string>(), path + ".role"));
    out->set_role(r);
    ASSIGN_OR_RETURN(*out->mutable_content(), ContentOf(m, path));
    ASSIGN_OR_RETURN(*out->mutable_reasoning_content(),
                     StringOf(m, "reasoning_content", path));
    ASSIGN_OR_RETURN(*out->mutable_tool_call_id(),
                     StringOf(m, "tool_call_id", path));
    RETURN_IF_ERROR(ToolCallsOf(m, path, *out));
  }
  if (body.is_object()) {
    RETURN_IF_ERROR(ToolsOf(body, chat));
    RETURN_IF_ERROR(ReasoningOf(body, chat));
  }
  return chat;
}

}  // namespace mneme::cli
