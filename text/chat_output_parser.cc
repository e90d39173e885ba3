#include "text/chat_output_parser.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "nlohmann/json.hpp"
#include "text/python_json.h"

namespace mneme::text {
namespace {

constexpr absl::string_view kThinkStart = "<think>";
constexpr absl::string_view kThinkEnd = "</think>";
// Newlines before a DSML block start that are dropped with it.
constexpr size_t kMaxDroppedNewlines = 16;
// Nesting allowed in a `string="false"` value (the JSON library recurses).
constexpr int kMaxValueDepth = 128;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  AppendJsonStringContents(s, &out);
  out.push_back('"');
  return out;
}

// `s` as compact JSON (key order kept), or nullopt when it is not JSON.
std::optional<std::string> CanonicalJson(absl::string_view s, int max_depth) {
  if (JsonNestingDepth(s) > max_depth) return std::nullopt;
  const nlohmann::ordered_json parsed =
      nlohmann::ordered_json::parse(s.begin(), s.end(), nullptr,
                                    /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return std::nullopt;
  return parsed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Python int(): optional sign, digits, surrounding whitespace.
std::optional<std::string> CanonicalInteger(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return std::nullopt;
  for (const char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  while (s.size() > 1 && s[0] == '0') s.remove_prefix(1);
  if (s == "0") negative = false;
  return absl::StrCat(negative ? "-" : "", s);
}

std::optional<std::string> CanonicalNumber(absl::string_view s) {
  double d = 0;
  if (!absl::SimpleAtod(s, &d) || !std::isfinite(d)) return std::nullopt;
  if (d == std::floor(d) && std::fabs(d) < 9.0e15) {
    return absl::StrCat(static_cast<int64_t>(d));
  }
  return nlohmann::json(d).dump();
}

// The JSON-schema type name for the aliases vLLM accepts.
std::string NormalizeType(absl::string_view type) {
  std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(type));
  static constexpr std::pair<absl::string_view, absl::string_view> kAliases[] =
      {
          {"str", "string"},     {"text", "string"},      {"varchar", "string"},
          {"char", "string"},    {"enum", "string"},      {"int", "integer"},
          {"int32", "integer"},  {"int64", "integer"},    {"uint", "integer"},
          {"uint32", "integer"}, {"uint64", "integer"},   {"long", "integer"},
          {"short", "integer"},  {"unsigned", "integer"}, {"float", "number"},
          {"float32", "number"}, {"float64", "number"},   {"double", "number"},
          {"bool", "boolean"},   {"dict", "object"},      {"arr", "array"},
          {"list", "array"},     {"sequence", "array"},
      };
  for (const auto& [alias, name] : kAliases) {
    if (t == alias) return std::string(name);
  }
  return t;
}

// The length of the longest proper prefix of one of `tags` that `s` ends
// with: text that may still become a tag.
size_t PartialTagLength(absl::string_view s,
                        const std::vector<absl::string_view>& tags) {
  size_t best = 0;
  for (const absl::string_view tag : tags) {
    const size_t limit = std::min(s.size(), tag.size() - 1);
    for (size_t k = limit; k > best; --k) {
      if (s.substr(s.size() - k) == tag.substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// The length of an unfinished UTF-8 sequence at the end of `s` (a delta
// split inside a character): held back so that it is escaped whole.
size_t IncompleteUtf8Tail(absl::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[s.size() - k]);
    if (IsContinuation(c)) continue;
    size_t need = 0;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    if (c >= 0xE0 && c <= 0xEF) need = 3;
    if (c >= 0xF0 && c <= 0xF4) need = 4;
    return need > k ? k : 0;
  }
  return 0;
}

size_t TrailingNewlines(absl::string_view s, size_t limit) {
  size_t n = 0;
  while (n < limit && n < s.size() && s[s.size() - 1 - n] == '\n') ++n;
  return n;
}

// Parses ` name="X" string="true|false"` (the attributes of a parameter tag).
bool ParseParamHeader(absl::string_view s, std::string* name, bool* is_string) {
  auto skip_space = [&s]() {
    size_t n = 0;
    while (n < s.size() && IsSpace(s[n])) ++n;
    s.remove_prefix(n);
    return n;
  };
  if (skip_space() == 0) return false;
  constexpr absl::string_view kName = "name=\"";
  if (!absl::StartsWith(s, kName)) return false;
  s.remove_prefix(kName.size());
  // Any name, even empty or with spaces (DeepSeek's stream parser accepts
  // them), as long as it has no quote.
  const size_t q = s.find('"');
  if (q == absl::string_view::npos) return false;
  *name = std::string(s.substr(0, q));
  s.remove_prefix(q + 1);
  if (skip_space() == 0) return false;
  if (absl::StartsWith(s, "string=\"true\"")) {
    *is_string = true;
  } else if (absl::StartsWith(s, "string=\"false\"")) {
    *is_string = false;
  } else {
    return false;
  }
  s.remove_prefix(*is_string ? 13 : 14);
  skip_space();
  return s.empty();
}

}  // namespace

ChatOutputParser::ChatOutputParser(ChatOutputParserOptions options)
    : options_(std::move(options)),
      state_(options_.thinking ? State::kReasoning : State::kContent) {
  const std::string dsml =
      "\xEF\xBD\x9C"
      "DSML"
      "\xEF\xBD\x9C";  // ｜DSML｜
  const std::string sp = options_.dialect == DsmlDialect::kV41 ? " " : "";
  const std::string block =
      options_.dialect == DsmlDialect::kV41 ? " calls" : "tool_calls";
  tags_.block_start = absl::StrCat("<", dsml, block, ">");
  tags_.block_end = absl::StrCat("</", dsml, block, ">");
  tags_.invoke_prefix = absl::StrCat("<", dsml, sp, "invoke name=\"");
  tags_.invoke_end = absl::StrCat("</", dsml, sp, "invoke>");
  tags_.param_start = absl::StrCat("<", dsml, sp, "parameter");
  tags_.param_close = absl::StrCat("</", dsml, sp, "parameter>");
}

std::vector<ChatOutputDelta> ChatOutputParser::Feed(absl::string_view text) {
  if (finished_) return {};
  buf_.append(text.data(), text.size());
  Process(/*final=*/false);
  return std::exchange(out_, {});
}

std::vector<ChatOutputDelta> ChatOutputParser::Finish() {
  if (finished_) return {};
  Process(/*final=*/true);
  finished_ = true;
  buf_.clear();
  return std::exchange(out_, {});
}

void ChatOutputParser::Process(bool final) {
  bool more = true;
  while (more) {
    switch (state_) {
      case State::kReasoning:
      case State::kContent:
        more = StepText(final);
        break;
      case State::kPreamble:
      case State::kInvokeBody:
      case State::kBetween:
        more = StepStructural(final);
        break;
      case State::kInvokeName:
        more = StepInvokeName(final);
        break;
      case State::kParamHeader:
        more = StepParamHeader(final);
        break;
      case State::kParamValue:
        more = StepParamValue(final);
        break;
      case State::kDone:
        buf_.clear();
        more = false;
        break;
    }
  }
}

bool ChatOutputParser::StepText(bool final) {
  const bool reasoning = state_ == State::kReasoning;
  const ChatOutputDelta::Kind kind =
      reasoning ? ChatOutputDelta::kReasoning : ChatOutputDelta::kContent;
  std::vector<absl::string_view> tags = {kThinkEnd};
  if (reasoning) tags.push_back(kThinkStart);
  if (options_.tools_enabled) tags.emplace_back(tags_.block_start);

  size_t best = std::string::npos;
  absl::string_view found;
  for (const absl::string_view tag : tags) {
    const size_t p = buf_.find(tag.data(), 0, tag.size());
    if (p < best) {
      best = p;
      found = tag;
    }
  }
  const absl::string_view buf(buf_);
  if (best != std::string::npos) {
    const absl::string_view before = buf.substr(0, best);
    if (found == tags_.block_start) {
      const size_t n = TrailingNewlines(before, kMaxDroppedNewlines);
      Emit(kind, before.substr(0, before.size() - n));
      block_raw_ = absl::StrCat(before.substr(before.size() - n), found);
      block_committed_ = false;
      elem_raw_.clear();
      state_ = State::kPreamble;
    } else {
      Emit(kind, before);
      if (found == kThinkEnd && reasoning) state_ = State::kContent;
    }
    buf_.erase(0, best + found.size());
    return true;
  }
  if (final) {
    Emit(kind, buf);
    buf_.clear();
    return false;
  }
  size_t hold = PartialTagLength(buf, tags);
  if (options_.tools_enabled) {
    hold +=
        TrailingNewlines(buf.substr(0, buf.size() - hold), kMaxDroppedNewlines);
  }
  Emit(kind, buf.substr(0, buf.size() - hold));
  buf_.erase(0, buf_.size() - hold);
  return false;
}

bool ChatOutputParser::StepStructural(bool final) {
  size_t ws = 0;
  while (ws < buf_.size() && IsSpace(buf_[ws])) ++ws;
  if (!block_committed_) block_raw_.append(buf_, 0, ws);
  buf_.erase(0, ws);
  if (buf_.empty()) {
    if (final) Truncate();
    return false;
  }
  const absl::string_view buf(buf_);
  if (state_ == State::kInvokeBody) {
    if (absl::StartsWith(buf, tags_.param_start)) {
      buf_.erase(0, tags_.param_start.size());
      elem_raw_ = tags_.param_start;
      param_header_.clear();
      header_in_quote_ = false;
      state_ = State::kParamHeader;
      return true;
    }
    if (absl::StartsWith(buf, tags_.invoke_end)) {
      buf_.erase(0, tags_.invoke_end.size());
      CloseCall();
      state_ = State::kBetween;
      return true;
    }
    if (absl::StartsWith(buf, tags_.block_end)) {
      CloseCall();
      buf_.clear();
      state_ = State::kDone;
      return false;
    }
    if (absl::StartsWith(tags_.param_start, buf) ||
        absl::StartsWith(tags_.invoke_end, buf) ||
        absl::StartsWith(tags_.block_end, buf)) {
      if (final) Truncate();
      return false;
    }
    Fail();
    return true;
  }
  // kPreamble, kBetween.
  if (absl::StartsWith(buf, tags_.invoke_prefix)) {
    if (calls_begun_ >= options_.max_tool_calls) {
      Fail();
      return true;
    }
    buf_.erase(0, tags_.invoke_prefix.size());
    elem_raw_ = tags_.invoke_prefix;
    invoke_name_.clear();
    state_ = State::kInvokeName;
    return true;
  }
  if (absl::StartsWith(buf, tags_.block_end)) {
    buf_.clear();
    block_raw_.clear();
    state_ = State::kDone;
    return false;
  }
  if (absl::StartsWith(tags_.invoke_prefix, buf) ||
      absl::StartsWith(tags_.block_end, buf)) {
    if (final) Truncate();
    return false;
  }
  Fail();
  return true;
}

bool ChatOutputParser::StepInvokeName(bool final) {
  const absl::string_view buf(buf_);
  const size_t q = buf.find('"');
  const absl::string_view part = buf.substr(0, q);
  size_t bad = 0;
  while (bad < part.size()) {
    const auto c = static_cast<unsigned char>(part[bad]);
    if (c == '<' || c == '>' || c < 0x20) break;
    ++bad;
  }
  if (bad < part.size() ||
      invoke_name_.size() + part.size() > options_.max_tag_bytes) {
    const size_t keep = std::min(bad, part.size());
    absl::StrAppend(&elem_raw_, part.substr(0, keep));
    buf_.erase(0, keep);
    Fail();
    return true;
  }
  if (q == absl::string_view::npos) {
    if (final) {
      Truncate();
      return false;
    }
    absl::StrAppend(&invoke_name_, part);
    absl::StrAppend(&elem_raw_, part);
    buf_.clear();
    return false;
  }
  if (q + 1 == buf.size()) {
    if (final) Truncate();
    return false;
  }
  absl::StrAppend(&invoke_name_, part);
  if (buf[q + 1] != '>' || invoke_name_.empty()) {
    absl::StrAppend(&elem_raw_, part);
    buf_.erase(0, q);
    Fail();
    return true;
  }
  buf_.erase(0, q + 2);
  BeginCall();
  state_ = State::kInvokeBody;
  return true;
}

bool ChatOutputParser::StepParamHeader(bool final) {
  size_t i = 0;
  bool bad = false;
  bool closed = false;
  for (; i < buf_.size(); ++i) {
    const char c = buf_[i];
    if (param_header_.size() + i >= options_.max_tag_bytes || c == '<') {
      bad = true;
      break;
    }
    if (c == '"') {
      header_in_quote_ = !header_in_quote_;
    } else if (c == '>' && !header_in_quote_) {
      closed = true;
      break;
    }
  }
  param_header_.append(buf_, 0, i);
  elem_raw_.append(buf_, 0, closed ? i + 1 : i);
  buf_.erase(0, closed ? i + 1 : i);
  if (bad) {
    Fail();
    return true;
  }
  if (!closed) {
    if (final) Truncate();
    return false;
  }
  if (!ParseParamHeader(param_header_, &param_name_, &param_is_string_) ||
      call_params_ >= options_.max_parameters) {
    Fail();
    return true;
  }
  param_value_.clear();
  if (param_is_string_) {
    EmitArgs(absl::StrCat(call_params_ == 0 ? "{" : ",",
                          JsonString(param_name_), ":\""));
    ++call_params_;
  }
  state_ = State::kParamValue;
  return true;
}

bool ChatOutputParser::StepParamValue(bool final) {
  const absl::string_view buf(buf_);
  const absl::string_view close(tags_.param_close);
  const size_t p = buf.find(close);
  if (param_is_string_) {
    std::string fragment;
    if (p != absl::string_view::npos) {
      AppendJsonStringContents(buf.substr(0, p), &fragment);
      fragment.push_back('"');
      EmitArgs(fragment);
      buf_.erase(0, p + close.size());
      state_ = State::kInvokeBody;
      return true;
    }
    const size_t hold = final ? 0
                              : std::max(PartialTagLength(buf, {close}),
                                         IncompleteUtf8Tail(buf));
    AppendJsonStringContents(buf.substr(0, buf.size() - hold), &fragment);
    EmitArgs(fragment);
    buf_.erase(0, buf_.size() - hold);
    if (final) Truncate();
    return false;
  }
  if (final && p == absl::string_view::npos) {
    Truncate();
    return false;
  }
  const size_t take = p != absl::string_view::npos
                          ? p
                          : buf.size() - PartialTagLength(buf, {close});
  if (param_value_.size() + take > options_.max_value_bytes) {
    elem_raw_.append(buf_, 0, take);
    buf_.erase(0, take);
    Fail();
    return true;
  }
  param_value_.append(buf_, 0, take);
  elem_raw_.append(buf_, 0, take);
  if (p == absl::string_view::npos) {
    buf_.erase(0, take);
    return false;
  }
  buf_.erase(0, p + close.size());
  EmitArgs(absl::StrCat(call_params_ == 0 ? "{" : ",", JsonString(param_name_),
                        ":", CoerceValue(param_value_)));
  ++call_params_;
  param_value_.clear();
  state_ = State::kInvokeBody;
  return true;
}

void ChatOutputParser::BeginCall() {
  uint64_t seed =
      options_.id_seed ^ (0xd1b54a32d192ed03ULL * (calls_begun_ + 1));
  const uint64_t a = SplitMix64(&seed);
  const uint64_t b = SplitMix64(&seed);
  ChatOutputDelta d;
  d.kind = ChatOutputDelta::kToolCallBegin;
  d.index = static_cast<int>(calls_begun_);
  d.id = absl::StrFormat("call_%016x%08x", a, b >> 32);
  d.name = invoke_name_;
  out_.push_back(std::move(d));
  ++calls_begun_;
  call_open_ = true;
  call_params_ = 0;
  block_committed_ = true;
  block_raw_.clear();
  elem_raw_.clear();
}

void ChatOutputParser::CloseCall() {
  if (!call_open_) return;
  if (state_ == State::kParamValue && param_is_string_) EmitArgs("\"");
  EmitArgs(call_params_ == 0 ? "{}" : "}");
  call_open_ = false;
}

void ChatOutputParser::Fail() {
  CloseCall();
  std::string text;
  if (!block_committed_) text = std::move(block_raw_);
  text += elem_raw_;
  block_raw_.clear();
  elem_raw_.clear();
  state_ = State::kContent;
  Emit(ChatOutputDelta::kContent, text);
}

void ChatOutputParser::Truncate() {
  if (!block_committed_ &&
      (state_ == State::kPreamble || state_ == State::kInvokeName)) {
    Emit(ChatOutputDelta::kContent, absl::StrCat(block_raw_, elem_raw_, buf_));
  } else {
    CloseCall();
  }
  buf_.clear();
  block_raw_.clear();
  elem_raw_.clear();
  state_ = State::kDone;
}

void ChatOutputParser::Emit(ChatOutputDelta::Kind kind,
                            absl::string_view text) {
  if (text.empty()) return;
  if (!out_.empty() && out_.back().kind == kind) {
    out_.back().text.append(text.data(), text.size());
    return;
  }
  ChatOutputDelta d;
  d.kind = kind;
  d.text = std::string(text);
  out_.push_back(std::move(d));
}

void ChatOutputParser::EmitArgs(absl::string_view text) {
  if (text.empty()) return;
  const int index = static_cast<int>(calls_begun_) - 1;
  if (!out_.empty() &&
      out_.back().kind == ChatOutputDelta::kToolCallArguments &&
      out_.back().index == index) {
    out_.back().text.append(text.data(), text.size());
    return;
  }
  ChatOutputDelta d;
  d.kind = ChatOutputDelta::kToolCallArguments;
  d.text = std::string(text);
  d.index = index;
  out_.push_back(std::move(d));
}

std::string ChatOutputParser::CoerceValue(const std::string& value) const {
  std::string type;
  if (const auto tool = options_.parameter_types.find(invoke_name_);
      tool != options_.parameter_types.end()) {
    if (const auto param = tool->second.find(param_name_);
        param != tool->second.end()) {
      type = NormalizeType(param->second);
    }
  }
  std::optional<std::string> coerced;
  if (type == "null") {
    if (absl::AsciiStrToLower(value) == "null") coerced = "null";
  } else if (type == "integer") {
    coerced = CanonicalInteger(value);
  } else if (type == "number") {
    coerced = CanonicalNumber(value);
  } else if (type == "boolean") {
    const std::string lower =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
    if (lower == "true" || lower == "1") coerced = "true";
    if (lower == "false" || lower == "0") coerced = "false";
  } else if (type == "object" || type == "array") {
    coerced = CanonicalJson(value, kMaxValueDepth);
  } else if (type == "string") {
    coerced = JsonString(value);
  }
  if (coerced.has_value()) return *std::move(coerced);
  if (std::optional<std::string> json = CanonicalJson(value, kMaxValueDepth)) {
    return *std::move(json);
  }
  return JsonString(value);
}

ParsedChatOutput ParseChatOutput(absl::string_view text,
                                 const ChatOutputParserOptions& options) {
  ChatOutputParser parser(options);
  std::vector<ChatOutputDelta> deltas = parser.Feed(text);
  std::vector<ChatOutputDelta> tail = parser.Finish();
  deltas.insert(deltas.end(), std::make_move_iterator(tail.begin()),
                std::make_move_iterator(tail.end()));
  std::string reasoning;
  std::string content;
  ParsedChatOutput result;
  for (ChatOutputDelta& d : deltas) {
    switch (d.kind) {
      case ChatOutputDelta::kReasoning:
        reasoning += d.text;
        break;
      case ChatOutputDelta::kContent:
        content += d.text;
        break;
      case ChatOutputDelta::kToolCallBegin:
        result.tool_calls.push_back(
            ParsedToolCall{std::move(d.id), std::move(d.name), ""});
        break;
      case ChatOutputDelta::kToolCallArguments:
        if (d.index >= 0 &&
            static_cast<size_t>(d.index) < result.tool_calls.size()) {
          result.tool_calls[d.index].arguments += d.text;
        }
        break;
    }
  }
  for (ParsedToolCall& call : result.tool_calls) {
    if (std::optional<std::string> json =
            CanonicalJson(call.arguments, kMaxValueDepth + 2)) {
      call.arguments = *std::move(json);
    }
  }
  if (!reasoning.empty()) result.reasoning = std::move(reasoning);
  if (!content.empty()) result.content = std::move(content);
  return result;
}

}  // namespace mneme::text
