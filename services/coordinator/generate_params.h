#ifndef MNEME_SERVICES_COORDINATOR_GENERATE_PARAMS_H_
#define MNEME_SERVICES_COORDINATOR_GENERATE_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/worker/v1/worker.pb.h"

namespace mneme::coordinator {

// One generation request as the engine runs it, whichever front built it.
// request_validator.h states and checks its limits.
struct GenerateParams {
  // The client's id; empty = the engine assigns one.
  std::string request_id;
  // The prompt's token ids.
  std::vector<int64_t> prompt;
  // Sampling of every new token (its seed is the request's base: token i is
  // drawn with seed + i, as `mneme run` does).
  worker::v1::SamplingParams sampling;
  // Tokens to generate at most. Default: 16.
  int64_t max_new_tokens = 16;
  // Besides the model's eos token.
  std::vector<int64_t> stop_token_ids;
  bool ignore_eos = false;
  // Each new token's log-probability (GenerateSink::OnTokens).
  bool logprobs = false;
  // N in [0, 20]: each new token's N most likely alternatives
  // (GenerateSink::OnTopLogprobs); > 0 needs logprobs. Default: 0.
  int top_logprobs = 0;
  // -1: off. N in [0, 20]: every prompt token's log-probability given the
  // tokens before it and the N most likely tokens at its position
  // (GenerateSink::OnPromptLogprobs). Default: -1.
  int prompt_logprobs = -1;
  // Speculative decoding for this request when the server runs it (false:
  // plain decodes). Default: true.
  bool speculative = true;
};

// What speculative decoding did for one request.
struct SpeculationUsage {
  // Decode steps with drafts, drafts proposed, drafts accepted.
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
};

// The most likely tokens at one position, most likely first (equal logits:
// lower id first), with their log-probabilities (log_softmax of the model's
// fp32 logits, unmodified by temperature or filtering).
struct TopLogprobs {
  std::vector<int64_t> token_ids;
  std::vector<float> logprobs;
};

// One prompt token with its log-probability.
struct TokenLogprobs {
  int64_t token_id = 0;
  // log p(token | the prompt tokens before it); nullopt for the first
  // prompt token, which has no context.
  std::optional<float> logprob;
  // The prompt_logprobs most likely tokens at this token's position (the
  // distribution `logprob` is taken from); empty for the first token.
  TopLogprobs top;
};

// What a client sees of the served model.
struct ModelInfo {
  std::string checkpoint;
  int64_t vocab_size = 0;
  // Prompt ids must also be below this when > 0: the tokenizer the Engram
  // hashing maps (worker.proto GetInfoResponse.engram_vocab_size).
  int64_t engram_vocab_size = 0;
  int64_t eos_token_id = 0;
  int64_t max_context_tokens = 0;
  int tp_size = 0;
  int dcp_size = 0;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_GENERATE_PARAMS_H_
