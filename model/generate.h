#ifndef MNEME_MODEL_GENERATE_H_
#define MNEME_MODEL_GENERATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/model.h"

namespace mneme::model {

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
};

struct GenerateResult {
  std::vector<int64_t> token_ids;  // Generated tokens only.
  std::vector<float> logprobs;     // Of each generated token.
  std::string finish_reason;       // "stop" (eos) or "length".
};

// Generates a continuation of `prompt` (>= 1 token) on `model` (any TP size,
// when every rank runs the same call). The sequence is released when done
// or on error. Errors of Model::Step.
absl::StatusOr<GenerateResult> Generate(Model& model, gpu::Backend& backend,
                                        const std::vector<int64_t>& prompt,
                                        const GenerateOptions& options);

// Draws one token from host logits [vocab] with `params`: {token, logprob}.
absl::StatusOr<std::pair<int64_t, float>> SampleToken(
    gpu::Backend& backend, const std::vector<float>& logits,
    const gpu::SamplingParams& params);

}  // namespace mneme::model

#endif  // MNEME_MODEL_GENERATE_H_
