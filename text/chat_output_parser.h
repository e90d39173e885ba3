#ifndef MNEME_TEXT_CHAT_OUTPUT_PARSER_H_
#define MNEME_TEXT_CHAT_OUTPUT_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mneme::text {

// The spelling of the DSML tool-call tags (CHAT_FORMAT.md section 2.2, 5.5).
enum class DsmlDialect {
  // DeepSeek-V4: `<｜DSML｜tool_calls>`, `<｜DSML｜invoke name="..">`,
  // `<｜DSML｜parameter name=".." string="true|false">`.
  kV4,
  // DeepSeek-V4.1: the spaced forms `<｜DSML｜ calls>`, `<｜DSML｜ invoke ..>`,
  // `<｜DSML｜ parameter ..>` and their closers.
  kV41,
};

// One complete OpenAI tool call.
struct ParsedToolCall {
  // "call_" followed by 24 lowercase hex digits.
  std::string id;
  // The function name, as the model wrote it.
  std::string name;
  // The arguments, the text of a JSON object.
  std::string arguments;
};

// One piece of streamed output.
struct ChatOutputDelta {
  enum Kind {
    // `text` is reasoning (the OpenAI `delta.reasoning_content`).
    kReasoning,
    // `text` is answer content (`delta.content`).
    kContent,
    // A tool call starts: `index`, `id` and `name` are set, `text` is empty.
    kToolCallBegin,
    // `text` is the next fragment of the arguments of tool call `index`.
    kToolCallArguments,
  };
  Kind kind = kContent;
  std::string text;
  // The tool call this delta belongs to, counted 0, 1, 2... across the whole
  // response; -1 for reasoning and content.
  int index = -1;
  // kToolCallBegin only.
  std::string id;
  std::string name;

  bool operator==(const ChatOutputDelta&) const = default;
};

struct ChatOutputParserOptions {
  // Tag spelling of the model. Default: kV4.
  DsmlDialect dialect = DsmlDialect::kV4;
  // The prompt ended in `<think>`: the output starts as reasoning and
  // `</think>` switches to content. False (chat mode): everything is content.
  // Default: true.
  bool thinking = true;
  // The request carried tools: a DSML block becomes tool calls. False: DSML
  // text is plain content. Default: true.
  bool tools_enabled = true;
  // JSON-schema types of the tools' parameters, tool name -> parameter name
  // -> type ("integer", "number", "boolean", "object", "array", "null",
  // "string", or an alias such as "int", "float", "bool", "list"). Used to
  // coerce `string="false"` values. Default: empty (values are kept when
  // they are valid JSON, else made JSON strings).
  std::map<std::string, std::map<std::string, std::string>> parameter_types;
  // Seed of the tool-call ids; the same seed gives the same ids. Default: 0.
  uint64_t id_seed = 0;
  // Tool calls per response; an `invoke` past this many, and all text after
  // it, is content. Default: 64.
  size_t max_tool_calls = 64;
  // Parameters per tool call; a call with more is malformed. Default: 256.
  size_t max_parameters = 256;
  // Bytes of one tag (an invoke name, a parameter header); longer is
  // malformed. Default: 1024.
  size_t max_tag_bytes = 1024;
  // Bytes of one `string="false"` value, which is held until it is complete;
  // longer is malformed. Default: 1 MiB.
  size_t max_value_bytes = size_t{1} << 20;
};

// Splits the decoded text of a DeepSeek-V4 / V4.1 completion into reasoning,
// content and OpenAI tool calls (CHAT_FORMAT.md sections 2.3 and 3), as the
// text streams in.
//
// Rules (vLLM's DeepSeek-V4 parser; DeepSeek's stream parser):
//  - In thinking mode the output starts as reasoning; `</think>` ends it. A
//    DSML block start also ends reasoning. A repeated `<think>` in reasoning
//    and a stray `</think>` in content are dropped.
//  - Newlines right before the DSML block start (up to 16) are neither
//    content nor reasoning.
//  - Each `invoke` gives a kToolCallBegin delta, then arguments fragments:
//    `{"name":` (or `,"name":` after the first parameter) and the value;
//    `}` (`{}` with no parameters) at the invoke's end. A `string="true"`
//    value streams as a JSON string chunk by chunk; any other value is held
//    until its close tag, then coerced (parameter_types) and sent whole. The
//    fragments of a call, concatenated, are one JSON object.
//  - Text after the closing block tag is discarded.
//  - Malformed DSML (unexpected text inside the block, a bad tag, a bound
//    exceeded) ends the tool block: an open call is closed and the text from
//    the bad element on is content. A block that fails before its first call
//    began comes back whole as content.
//  - Finish() on a truncated block closes an open call with the parameters
//    that are complete (a started `string="true"` value is kept, a started
//    other value dropped); an unfinished first invoke tag comes back as
//    content, a later one is dropped.
// Buffering is bounded: at most one tag's length (plus 16 newlines) of text
// is held back, and the options bound the rest.
//
// Call order: Feed() for each decoded text delta (whole UTF-8 characters;
// tags may be split anywhere), then Finish() once. One per response, not
// thread-safe.
class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatOutputParserOptions options);

  // Takes the next text delta; returns what can be sent now. Adjacent
  // reasoning (content, same-call arguments) pieces are merged. Nothing
  // after Finish().
  std::vector<ChatOutputDelta> Feed(absl::string_view text);

  // The end of generation: flushes held-back text and closes a truncated
  // tool block. Later calls return nothing.
  std::vector<ChatOutputDelta> Finish();

  // Whether any tool call began (finish_reason "tool_calls").
  bool saw_tool_calls() const { return calls_begun_ > 0; }

 private:
  enum class State {
    kReasoning,
    kContent,
    // After the block start, before the first invoke.
    kPreamble,
    // Inside `invoke name="`, reading the name.
    kInvokeName,
    // Inside an invoke, between parameters.
    kInvokeBody,
    // Inside `<｜DSML｜parameter`, reading the attributes up to `>`.
    kParamHeader,
    kParamValue,
    // After an invoke's end, before the next invoke or the block end.
    kBetween,
    // After the block end: the rest is discarded.
    kDone,
  };

  struct Tags {
    std::string block_start;
    std::string block_end;
    std::string invoke_prefix;
    std::string invoke_end;
    std::string param_start;
    std::string param_close;
  };

  // Runs the state machine over buf_. `final`: no more text comes.
  void Process(bool final);
  // One step in a state; false when it needs more text (or, with `final`,
  // when everything was consumed).
  bool StepText(bool final);
  bool StepStructural(bool final);
  bool StepInvokeName(bool final);
  bool StepParamHeader(bool final);
  bool StepParamValue(bool final);

  // A malformed or over-bound element: closes an open call, sends the
  // unusable raw text as content and continues in content state.
  void Fail();
  // Finish() inside the block.
  void Truncate();
  void CloseCall();
  void BeginCall();

  void Emit(ChatOutputDelta::Kind kind, absl::string_view text);
  void EmitArgs(absl::string_view text);
  std::string CoerceValue(const std::string& value) const;

  ChatOutputParserOptions options_;
  Tags tags_;
  State state_;
  bool finished_ = false;
  // Unconsumed text.
  std::string buf_;
  std::vector<ChatOutputDelta> out_;

  // Raw text of the block before its first call began (held-back newlines,
  // the block start, whitespace); returned as content if the block fails.
  std::string block_raw_;
  // A call of the current block has begun, or no block is open; false
  // while block_raw_ may still come back as content.
  bool block_committed_ = true;
  // Raw text of the element being read (an invoke tag, a parameter).
  std::string elem_raw_;

  size_t calls_begun_ = 0;
  bool call_open_ = false;
  size_t call_params_ = 0;
  std::string invoke_name_;
  std::string param_header_;
  bool header_in_quote_ = false;
  std::string param_name_;
  bool param_is_string_ = false;
  std::string param_value_;
};

// The whole completion at once.
struct ParsedChatOutput {
  // Null when empty (or in chat mode).
  std::optional<std::string> reasoning;
  // Null when empty (e.g. the output ended inside reasoning, or the tool
  // block came first).
  std::optional<std::string> content;
  std::vector<ParsedToolCall> tool_calls;
};

// Parses a complete completion with the rules of ChatOutputParser (fed the
// whole text, then finished); each call's arguments are the concatenated
// fragments, normalised to compact JSON (a repeated parameter keeps its first
// place and its last value).
ParsedChatOutput ParseChatOutput(absl::string_view text,
                                 const ChatOutputParserOptions& options);

}  // namespace mneme::text

#endif  // MNEME_TEXT_CHAT_OUTPUT_PARSER_H_
