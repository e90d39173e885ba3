#include "model/generate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<std::pair<int64_t, float>> SampleToken(
    gpu::Backend& backend, const std::vector<float>& logits,
    const gpu::SamplingParams& params) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> buffer,
                   backend.Allocate(vocab));
  backend.CopyFromHost(logits, buffer->data());
  int32_t id = 0;
  float logprob = 0;
  backend.Sample(buffer->view(1, vocab), {params}, absl::MakeSpan(&id, 1),
                 absl::MakeSpan(&logprob, 1));
  return std::make_pair(int64_t{id}, logprob);
}

absl::StatusOr<GenerateResult> Generate(Model& model, gpu::Backend& backend,
                                        const std::vector<int64_t>& prompt,
                                        const GenerateOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens=", options.max_new_tokens, " must be >= 0"));
  }
  const uint64_t id = options.sequence_id;
  GenerateResult result;
  result.finish_reason = "length";
  if (options.max_new_tokens == 0) return result;
  auto fail = [&](absl::Status st) {
    model.Release(id);
    return st;
  };
  const int64_t chunk = options.prefill_chunk_tokens > 0
                            ? options.prefill_chunk_tokens
                            : static_cast<int64_t>(prompt.size());
  std::vector<float> logits;
  int64_t position = 0;
  std::vector<int64_t> next(prompt.begin(), prompt.end());
  for (int64_t step = 0;; ++step) {
    // Prefill in chunks; then one token per step.
    for (size_t begin = 0; begin < next.size();) {
      const size_t end =
          std::min(next.size(), begin + static_cast<size_t>(chunk));
      StepInput in;
      SequenceChunk c;
      c.sequence_id = id;
      c.tokens.assign(next.begin() + begin, next.begin() + end);
      c.start_position = position;
      c.logits = end == next.size() ? SequenceChunk::Logits::kLast
                                    : SequenceChunk::Logits::kNone;
      in.chunks.push_back(std::move(c));
      absl::StatusOr<StepOutput> out = model.Step(in);
      if (!out.ok()) return fail(out.status());
      position += static_cast<int64_t>(end - begin);
      if (end == next.size()) logits = std::move(out->logits[0]);
      begin = end;
    }
    gpu::SamplingParams params = options.sampling;
    params.seed = options.sampling.seed + static_cast<uint64_t>(step);
    absl::StatusOr<std::pair<int64_t, float>> token =
        SampleToken(backend, logits, params);
    if (!token.ok()) return fail(token.status());
    result.token_ids.push_back(token->first);
    result.logprobs.push_back(token->second);
    if (options.stop_at_eos && token->first == model.dims().eos_token_id) {
      result.finish_reason = "stop";
      break;
    }
    if (static_cast<int64_t>(result.token_ids.size()) >=
        options.max_new_tokens) {
      break;
    }
    next = {token->first};
  }
  model.Release(id);
  return result;
}

}  // namespace mneme::model
