#ifndef MNEME_SERVICES_COORDINATOR_OPENAI_CHOICE_H_
#define MNEME_SERVICES_COORDINATOR_OPENAI_CHOICE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/engine.h"
#include "services/coordinator/openai_request.h"
#include "services/coordinator/text_stream.h"
#include "text/chat_output_parser.h"
#include "text/tokenizer.h"

namespace mneme::coordinator {

// One choice of an OpenAI response as it is produced: the generated tokens
// decoded (stop strings cut), for chat split into reasoning, content and
// tool calls (text::ChatOutputParser), with the log-probabilities in the
// endpoint's shape. Streaming: Delta() per batch of tokens, then Finish();
// non-streaming: the same calls, then Message(). Thread-compatible; the
// tokenizer and the request are borrowed.
class ChoiceOutput {
 public:
  ChoiceOutput(const OpenAiRequest& request, int index,
               const text::Tokenizer& tokenizer, uint64_t id_seed);

  // The prompt (echo, prompt_logprobs): its ids and its text (nullopt:
  // decode the ids).
  void SetPrompt(absl::Span<const int64_t> ids,
                 const std::optional<std::string>& text);
  // The next prompt positions' log-probabilities, in prompt order (before
  // the first Add()).
  void AddPromptPositions(absl::Span<const TokenLogprobs> positions);

  // New tokens with their log-probabilities and alternatives (`top` may be
  // empty). Returns the streaming choice object for them, or nullopt when
  // they add nothing to send yet.
  std::optional<nlohmann::json> Add(absl::Span<const int64_t> tokens,
                                    absl::Span<const float> logprobs,
                                    absl::Span<const TopLogprobs> top);
  // The end: what was held back, and the finish reason. Returns the last
  // streaming choice objects (the held-back text, then the one with
  // finish_reason).
  std::vector<nlohmann::json> Finish(GenerateEnd end);

  // Whether a stop string ended the text (the request should be aborted).
  bool stopped() const { return text_.stopped(); }
  // Non-streaming: the whole choice, after Finish().
  nlohmann::json Whole() const;
  // vLLM's prompt_logprobs list ([null, {"<id>": {...}}, ...]), or null.
  nlohmann::json PromptLogprobsJson() const;

 private:
  // With echo, the prompt's text into the delta the first time; whether it
  // went in.
  bool TakePrompt(nlohmann::json& delta);
  // New text into the delta's fields (through the parser for chat).
  void Route(const std::string& text, nlohmann::json& delta);
  void Apply(const std::vector<text::ChatOutputDelta>& deltas,
             nlohmann::json& delta);
  // `offset`: the text_offset of the first token, advanced past them.
  nlohmann::json LogprobsJson(absl::Span<const int64_t> tokens,
                              absl::Span<const float> logprobs,
                              absl::Span<const TopLogprobs> top,
                              bool with_prompt, int64_t& offset) const;
  std::string TokenString(int64_t id) const;

  const OpenAiRequest& request_;
  const int index_;
  const text::Tokenizer& tokenizer_;
  TextStream text_;
  std::unique_ptr<text::ChatOutputParser> parser_;
  bool first_ = true;
  bool prompt_sent_ = false;
  std::string finish_reason_;

  // The prompt.
  std::vector<int64_t> prompt_ids_;
  std::string prompt_text_;
  std::vector<TokenLogprobs> prompt_positions_;

  // Everything, for Whole().
  std::string text_all_;
  std::string reasoning_all_;
  std::string content_all_;
  bool saw_reasoning_ = false;
  nlohmann::json tool_calls_ = nlohmann::json::array();
  std::vector<int64_t> tokens_all_;
  std::vector<float> logprobs_all_;
  std::vector<TopLogprobs> top_all_;
  // Completions text_offset: characters of text before the next token.
  int64_t offset_ = 0;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_OPENAI_CHOICE_H_
