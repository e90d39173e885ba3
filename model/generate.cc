#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<std::pair<int64_t, float>> SampleToken(
    gpu::Backend& backend, absl::Span<const float> logits,
    const gpu::SamplingParams& params) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (vocab == 0) return absl::InvalidArgumentError("empty logits row");
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> buffer,
                   backend.Allocate(vocab));
  backend.CopyFromHost(logits, buffer->data());
  int32_t id = 0;
  float logprob = 0;
  backend.Sample(buffer->view(1, vocab), {params}, absl::MakeSpan(&id, 1),
                 absl::MakeSpan(&logprob, 1));
  return std::make_pair(int64_t{id}, logprob);
}

absl::StatusOr<PositionLogprobs> RowLogprobs(absl::Span<const float> logits,
                                             int64_t target, int top_n) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (vocab == 0) return absl::InvalidArgumentError("empty logits row");
  if (target < -1 || target >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target ", target, " is outside the vocabulary [0, ", vocab, ")"));
  }
  if (top_n < 0 || top_n > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_n=", top_n, " must be in [0, ", kMaxTopLogprobs, "]"));
  }
  float max = logits[0];
  for (const float x : logits) max = std::max(max, x);
  double sum = 0;
  for (const float x : logits) {
    sum += std::exp(static_cast<double>(x) - static_cast<double>(max));
  }
  const double lse = static_cast<double>(max) + std::log(sum);
  auto logprob = [&](int64_t id) {
    return static_cast<float>(static_cast<double>(logits[id]) - lse);
  };
  PositionLogprobs out;
  out.target_logprob =
      target >= 0 ? logprob(target) : std::numeric_limits<float>::quiet_NaN();
  const int64_t n = std::min<int64_t>(top_n, vocab);
  if (n > 0) {
    // The n largest logits, ties broken by the lower id: a bounded
    // selection, never a sort of the whole vocabulary.
    auto better = [&](int64_t a, int64_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::vector<int64_t> top;
    top.reserve(n + 1);
    for (int64_t id = 0; id < vocab; ++id) {
      if (static_cast<int64_t>(top.size()) == n && !better(id, top.back())) {
        continue;
      }
      top.insert(std::upper_bound(top.begin(), top.end(), id, better), id);
      if (static_cast<int64_t>(top.size()) > n) top.pop_back();
    }
    out.top_ids = top;
    for (const int64_t id : top) out.top_logprobs.push_back(logprob(id));
  }
  return out;
}

absl::StatusOr<GenerateResult> Generate(Model& model, gpu::Backend& backend,
                                        const std::vector<int64_t>& prompt,
                                        const GenerateOptions& options) {
  const absl::Time began = absl::Now();
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens=", options.max_new_tokens, " must be >= 0"));
  }
  if (options.prompt_logprobs < -1 ||
      options.prompt_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_logprobs=", options.prompt_logprobs,
                     " must be -1 or in [0, ", kMaxTopLogprobs, "]"));
  }
  if (options.top_logprobs < 0 || options.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs=", options.top_logprobs, " must be in [0, ",
                     kMaxTopLogprobs, "]"));
  }
  const uint64_t id = options.sequence_id;
  GenerateResult result;
  result.finish_reason = "length";
  const bool want_prompt = options.prompt_logprobs >= 0;
  if (options.max_new_tokens == 0 && !want_prompt) return result;
  if (want_prompt) {
    result.prompt_logprobs.resize(1);
    result.prompt_logprobs[0].target_logprob =
        std::numeric_limits<float>::quiet_NaN();
  }
  const int64_t vocab = model.dims().vocab_size;
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
      const bool all = want_prompt && step == 0;
      c.logits = all                  ? SequenceChunk::Logits::kAll
                 : end == next.size() ? SequenceChunk::Logits::kLast
                                      : SequenceChunk::Logits::kNone;
      in.chunks.push_back(std::move(c));
      absl::StatusOr<StepOutput> out = model.Step(in);
      if (!out.ok()) return fail(out.status());
      position += static_cast<int64_t>(end - begin);
      if (all) {
        // Row r predicts prompt[begin + r + 1]; the last row of the prompt
        // predicts the first new token.
        const std::vector<float>& rows = out->logits[0];
        for (size_t p = begin; p < end && p + 1 < next.size(); ++p) {
          absl::StatusOr<PositionLogprobs> lp =
              RowLogprobs(absl::MakeConstSpan(rows).subspan(
                              (p - begin) * static_cast<size_t>(vocab),
                              static_cast<size_t>(vocab)),
                          next[p + 1], options.prompt_logprobs);
          if (!lp.ok()) return fail(lp.status());
          result.prompt_logprobs.push_back(*std::move(lp));
        }
        if (end == next.size()) {
          logits.assign(rows.end() - vocab, rows.end());
        }
      } else if (end == next.size()) {
        logits = std::move(out->logits[0]);
      }
      begin = end;
    }
    if (options.max_new_tokens == 0) break;
    gpu::SamplingParams params = options.sampling;
    params.seed = options.sampling.seed + static_cast<uint64_t>(step);
    absl::StatusOr<std::pair<int64_t, float>> token =
        SampleToken(backend, logits, params);
    if (!token.ok()) return fail(token.status());
    result.token_ids.push_back(token->first);
    result.token_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - began));
    if (options.top_logprobs > 0) {
      absl::StatusOr<PositionLogprobs> lp =
          RowLogprobs(logits, token->first, options.top_logprobs);
      if (!lp.ok()) return fail(lp.status());
      result.logprobs.push_back(lp->target_logprob);
      result.top_logprobs.push_back(*std::move(lp));
    } else {
      result.logprobs.push_back(token->second);
    }
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
