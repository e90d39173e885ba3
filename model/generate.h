#ifndef MNEME_MODEL_GENERATE_H_
#define MNEME_MODEL_GENERATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "model/model.h"
#include "model/spec/dspark.h"
#include "model/spec/verify.h"

namespace mneme::model {

// Most alternatives a log-probability request may ask for per position
// (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

// The next-token distribution at one position, as log-probabilities: the
// log_softmax of the position's fp32 logits (the unmodified model
// distribution: no temperature, no filtering).
struct PositionLogprobs {
  // log p(target) for the target given to RowLogprobs; NaN without one.
  float target_logprob = 0;
  // The most likely tokens, most likely first (equal logits: lower id
  // first), and their log-probabilities; top_ids[0] is the argmax.
  std::vector<int64_t> top_ids;
  std::vector<float> top_logprobs;
};

// Log-probabilities of one row of logits [vocab]: log p(target) (target -1:
// none, NaN) and the `top_n` most likely tokens. The log-sum-exp is
// accumulated in double and every value is logit - lse rounded to float, so
// the target's value equals its entry in the top list. InvalidArgument for
// an empty row, a target outside [-1, vocab) or top_n outside [0,
// kMaxTopLogprobs].
absl::StatusOr<PositionLogprobs> RowLogprobs(absl::Span<const float> logits,
                                             int64_t target, int top_n);

struct GenerateOptions {
  // Tokens to generate at most; >= 0. Default: 16.
  int64_t max_new_tokens = 16;
  // Sampling of every new token (seed: the base seed; token i is drawn with
  // seed + i). Default: greedy.
  gpu::SamplingParams sampling;
  // Stop after the end-of-sequence token (which is kept in the output).
  // Default: true.
  bool stop_at_eos = true;
  // The prompt is fed in chunks of at most this many tokens (chunked
  // prefill); 0 = all at once. Default: 0.
  int64_t prefill_chunk_tokens = 0;
  // The sequence id used on the model (released at the end). Default: 1.
  uint64_t sequence_id = 1;
  // -1: off. N in [0, kMaxTopLogprobs]: compute the prompt's
  // log-probabilities (GenerateResult::prompt_logprobs) with the top N
  // tokens at each position; the prompt is then prefilled even when
  // max_new_tokens is 0. Default: -1.
  int prompt_logprobs = -1;
  // The top N tokens of each new token's distribution, in [0,
  // kMaxTopLogprobs] (GenerateResult::top_logprobs). Default: 0.
  int top_logprobs = 0;
  // Speculative decoding: a DSpark drafter of the model (borrowed; null:
  // off) and the drafts verified per step, in [0, min(its block size, the
  // model's max_speculative_tokens)] (0: off). Greedy requests are verified
  // greedily (the output equals plain greedy decoding), sampled ones with
  // `verify_rule` (the target distribution is preserved). Default: off.
  DsparkDrafter* drafter = nullptr;
  int num_speculative_tokens = 0;
  VerifyRule verify_rule = VerifyRule::kBlock;
};

// What speculative decoding did in one generation (vLLM's spec-decode
// counters): verify steps, those with drafts, drafts proposed and
// accepted, and acceptances by draft position.
struct SpeculativeStats {
  int64_t steps = 0;
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;
};

struct GenerateResult {
  std::vector<int64_t> token_ids;  // Generated tokens only.
  std::vector<float> logprobs;     // Of each generated token.
  std::string finish_reason;       // "stop" (eos) or "length".
  // With prompt_logprobs >= 0: one entry per prompt token. Entry i >= 1 is
  // the distribution at position i - 1 with target prompt[i] (log p(prompt[i]
  // | prompt[<i]) and the top N); entry 0 has no logprob (NaN) and no top.
  std::vector<PositionLogprobs> prompt_logprobs;
  // With top_logprobs > 0: per generated token, the distribution it was
  // drawn from (target: the token).
  std::vector<PositionLogprobs> top_logprobs;
  // When each generated token was sampled, seconds after Generate began
  // (its inter-token latencies are the differences).
  std::vector<double> token_seconds;
  // With a drafter: what speculation did.
  SpeculativeStats speculative;
};

// Generates a continuation of `prompt` (>= 1 token) on `model` (any TP size,
// when every rank runs the same call). The sequence is released when done
// or on error. InvalidArgument for an empty prompt, max_new_tokens < 0 or
// a logprob count out of range; errors of Model::Step. With top_logprobs >
// 0 the new tokens' logprobs come from RowLogprobs (as their top entries)
// rather than from the backend's sampler.
absl::StatusOr<GenerateResult> Generate(Model& model,
                                        const std::vector<int64_t>& prompt,
                                        const GenerateOptions& options);

}  // namespace mneme::model

#endif  // MNEME_MODEL_GENERATE_H_
