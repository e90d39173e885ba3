#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "model/spec/verify.h"

namespace mneme::model {

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

namespace {

// Feeds `tokens` to the sequence from `position` in chunks of at most
// `chunk`, with the taps when `drafter` is set (extending it); the logits of
// the last position in `last`, and with `prompt_logprobs` >= 0 the
// distribution of every later token appended to `prompt_lps`.
absl::Status Prefill(Model& model, const std::vector<int64_t>& tokens,
                     uint64_t id, int64_t chunk, int prompt_logprobs,
                     DsparkDrafter* drafter, std::vector<float>& last,
                     std::vector<PositionLogprobs>& prompt_lps) {
  const int64_t vocab = model.dims().vocab_size;
  const bool all = prompt_logprobs >= 0;
  for (size_t begin = 0; begin < tokens.size();) {
    const size_t end =
        std::min(tokens.size(), begin + static_cast<size_t>(chunk));
    StepInput in;
    SequenceChunk c;
    c.sequence_id = id;
    c.tokens.assign(tokens.begin() + begin, tokens.begin() + end);
    c.start_position = static_cast<int64_t>(begin);
    c.logits = all                    ? SequenceChunk::Logits::kAll
               : end == tokens.size() ? SequenceChunk::Logits::kLast
                                      : SequenceChunk::Logits::kNone;
    c.taps = drafter != nullptr;
    in.chunks.push_back(std::move(c));
    ASSIGN_OR_RETURN(StepOutput out, model.Step(in));
    if (drafter != nullptr) {
      RETURN_IF_ERROR(drafter->Extend(id, static_cast<int64_t>(begin),
                                      static_cast<int64_t>(end - begin),
                                      out.taps[0]));
    }
    const std::vector<float>& rows = out.logits[0];
    if (all) {
      // Row r predicts tokens[begin + r + 1]; the last row of the prompt
      // predicts the first new token.
      for (size_t p = begin; p < end && p + 1 < tokens.size(); ++p) {
        ASSIGN_OR_RETURN(
            PositionLogprobs lp,
            RowLogprobs(absl::MakeConstSpan(rows).subspan(
                            (p - begin) * static_cast<size_t>(vocab),
                            static_cast<size_t>(vocab)),
                        tokens[p + 1], prompt_logprobs));
        prompt_lps.push_back(std::move(lp));
      }
    }
    if (end == tokens.size()) last.assign(rows.end() - vocab, rows.end());
    begin = end;
  }
  return absl::OkStatus();
}

// Appends a generated token with the distribution it came from (`row`, the
// target's logits at its position, empty when only the draw came back;
// `sampled_logprob` when the backend's sampler gave it). Returns whether
// generation ends with it.
absl::StatusOr<bool> Emit(const Model& model, const GenerateOptions& options,
                          absl::Time began, int64_t token,
                          absl::Span<const float> row, float sampled_logprob,
                          GenerateResult& result) {
  result.token_ids.push_back(token);
  result.token_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - began));
  if (options.top_logprobs > 0 ||
      (std::isnan(sampled_logprob) && !row.empty())) {
    ASSIGN_OR_RETURN(PositionLogprobs lp,
                     RowLogprobs(row, token, options.top_logprobs));
    result.logprobs.push_back(lp.target_logprob);
    if (options.top_logprobs > 0) result.top_logprobs.push_back(std::move(lp));
  } else {
    result.logprobs.push_back(sampled_logprob);
  }
  if (options.stop_at_eos && token == model.dims().eos_token_id) {
    result.finish_reason = "stop";
    return true;
  }
  return static_cast<int64_t>(result.token_ids.size()) >=
         options.max_new_tokens;
}

// The speculative loop after the prefill: draft k tokens from the anchor,
// verify [anchor, drafts] in one step, keep the accepted prefix and the
// target's next token, roll the rest back.
absl::Status SpeculativeDecode(Model& model, const GenerateOptions& options,
                               uint64_t id, int64_t position,
                               const std::vector<float>& logits,
                               absl::Time began, GenerateResult& result) {
  DsparkDrafter& drafter = *options.drafter;
  const int64_t vocab = model.dims().vocab_size;
  const bool greedy = !(options.sampling.temperature > 0.0f);
  SpeculativeStats& stats = result.speculative;
  stats.accepted_per_position.assign(options.num_speculative_tokens, 0);
  // The first token comes from the prefill's logits.
  gpu::SamplingParams params = options.sampling;
  ASSIGN_OR_RETURN(auto first, model.SampleToken(logits, params));
  ASSIGN_OR_RETURN(bool done, Emit(model, options, began, first.first, logits,
                                   first.second, result));
  int64_t anchor = first.first;
  for (uint64_t step = 1; !done; ++step) {
    const int64_t left =
        options.max_new_tokens - static_cast<int64_t>(result.token_ids.size());
    int k = static_cast<int>(std::min<int64_t>(
        {options.num_speculative_tokens, drafter.block_size(), left - 1}));
    // Seeds of this step: the drafts' and the verifier's.
    const uint64_t seed = options.sampling.seed + step * 0x9E3779B97F4A7C15ull;
    DraftProposal proposal;
    if (k > 0) {
      DraftRequest request;
      request.sequence_id = id;
      request.anchor = anchor;
      request.sampling = options.sampling;
      request.sampling.seed = DraftSeed(seed);
      ASSIGN_OR_RETURN(std::vector<DraftProposal> proposals,
                       drafter.Propose({request}));
      proposal = std::move(proposals[0]);
      k = UsableDrafts(proposal.tokens, k, model.engram_vocab_size());
    }
    StepInput in;
    SequenceChunk c;
    c.sequence_id = id;
    c.tokens.push_back(anchor);
    c.tokens.insert(c.tokens.end(), proposal.tokens.begin(),
                    proposal.tokens.begin() + k);
    c.start_position = position;
    c.logits = SequenceChunk::Logits::kAll;
    c.taps = true;
    in.chunks.push_back(std::move(c));
    ASSIGN_OR_RETURN(StepOutput out, model.Step(in));
    const std::vector<float>& rows = out.logits[0];
    const absl::Span<const int64_t> drafts =
        absl::MakeConstSpan(proposal.tokens).subspan(0, k);
    Verdict verdict;
    if (greedy) {
      verdict = VerifyGreedy(rows, vocab, drafts);
    } else {
      std::vector<std::vector<double>> target, draft;
      for (int j = 0; j <= k; ++j) {
        target.push_back(SamplingDistribution(
            absl::MakeConstSpan(rows).subspan(j * vocab, vocab),
            options.sampling));
        if (j < k) {
          draft.push_back(SamplingDistribution(
              absl::MakeConstSpan(proposal.logits).subspan(j * vocab, vocab),
              options.sampling));
        }
      }
      verdict = VerifySampled(target, draft, drafts, options.verify_rule,
                              seed ^ 0x5851F42D4C957F2Dull);
    }
    const int a = verdict.accepted;
    // The anchor and the accepted drafts are committed; the rest is undone.
    RETURN_IF_ERROR(model.Truncate(id, position + 1 + a));
    // The verify chunk's taps cover all its positions (k < TapRows()).
    RETURN_IF_ERROR(drafter.Extend(
        id, position, 1 + a,
        absl::MakeConstSpan(out.taps[0])
            .subspan(0, (1 + a) * (out.taps[0].size() / (k + 1)))));
    position += 1 + a;
    if (k > 0) {
      stats.drafts += 1;
      stats.draft_tokens += k;
      stats.accepted_tokens += a;
      for (int j = 0; j < a; ++j) stats.accepted_per_position[j] += 1;
    }
    stats.steps += 1;
    for (int j = 0; j <= a && !done; ++j) {
      const int64_t token = j < a ? drafts[j] : verdict.next;
      ASSIGN_OR_RETURN(done,
                       Emit(model, options, began, token,
                            absl::MakeConstSpan(rows).subspan(j * vocab, vocab),
                            std::numeric_limits<float>::quiet_NaN(), result));
    }
    anchor = verdict.next;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerateResult> Generate(Model& model,
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
  const bool speculative =
      options.drafter != nullptr && options.num_speculative_tokens > 0;
  if (options.num_speculative_tokens < 0 ||
      (speculative && options.num_speculative_tokens >
                          std::min(options.drafter->block_size(),
                                   model.options().max_speculative_tokens))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_speculative_tokens=", options.num_speculative_tokens,
        " must be in [0, min(the drafter's block size, the model's "
        "max_speculative_tokens)]"));
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
  auto release = [&] {
    model.Release(id);
    if (options.drafter != nullptr) options.drafter->Release(id);
  };
  auto fail = [&](absl::Status st) {
    release();
    return st;
  };
  const int64_t chunk = options.prefill_chunk_tokens > 0
                            ? options.prefill_chunk_tokens
                            : static_cast<int64_t>(prompt.size());
  std::vector<float> logits;
  if (absl::Status st =
          Prefill(model, prompt, id, chunk, options.prompt_logprobs,
                  speculative ? options.drafter : nullptr, logits,
                  result.prompt_logprobs);
      !st.ok()) {
    return fail(st);
  }
  if (options.max_new_tokens == 0) {
    release();
    return result;
  }
  if (speculative) {
    if (absl::Status st = SpeculativeDecode(model, options, id,
                                            static_cast<int64_t>(prompt.size()),
                                            logits, began, result);
        !st.ok()) {
      return fail(st);
    }
    release();
    return result;
  }
  int64_t position = static_cast<int64_t>(prompt.size());
  // Token `step` is drawn with seed + step: the first from the prompt's
  // last row, each later one inside the step that computes its row (where
  // the logits are), which returns the row only for top log-probabilities.
  gpu::SamplingParams params = options.sampling;
  absl::StatusOr<std::pair<int64_t, float>> first =
      model.SampleToken(logits, params);
  if (!first.ok()) return fail(first.status());
  SampledToken token{.id = first->first, .logprob = first->second};
  const bool rows = options.top_logprobs > 0;
  for (uint64_t step = 1;; ++step) {
    absl::StatusOr<bool> done =
        Emit(model, options, began, token.id, logits, token.logprob, result);
    if (!done.ok()) return fail(done.status());
    if (*done) break;
    params.seed = options.sampling.seed + step;
    StepInput in;
    SequenceChunk c;
    c.sequence_id = id;
    c.tokens = {token.id};
    c.start_position = position;
    c.logits =
        rows ? SequenceChunk::Logits::kLast : SequenceChunk::Logits::kNone;
    c.sample = true;
    c.sampling = params;
    in.chunks.push_back(std::move(c));
    absl::StatusOr<StepOutput> out = model.Step(in);
    if (!out.ok()) return fail(out.status());
    token = out->sampled[0];
    if (rows) {
      logits = std::move(out->logits[0]);
    } else {
      logits.clear();
    }
    position += 1;
  }
  release();
  return result;
}

}  // namespace mneme::model
