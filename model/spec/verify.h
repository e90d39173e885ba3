#ifndef MNEME_MODEL_SPEC_VERIFY_H_
#define MNEME_MODEL_SPEC_VERIFY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gpu/backend.h"

namespace mneme::model {

// How drafts are verified when sampling (temperature > 0; greedy requests
// are always verified greedily).
enum class VerifyRule {
  // Sun et al. block verification (the DSpark recipe's
  // rejection_sample_method "block"): never accepts fewer tokens in
  // expectation than the per-token rule. Default.
  kBlock = 0,
  // The per-token rule of Leviathan et al. / Chen et al.
  kStandard = 1,
};

// "block" / "standard"; InvalidArgument otherwise.
absl::StatusOr<VerifyRule> ParseVerifyRule(absl::string_view name);

// The distribution a token is drawn from under `params` for one row of
// logits, as the backends' samplers define it (gpu/backend.h
// SamplingParams): temperature, then top-k, then top-p of what top-k kept,
// then min-p; probabilities normalised over the kept tokens, 0 elsewhere.
// Greedy (temperature 0) is the one-hot of the argmax (lowest id on ties).
std::vector<double> SamplingDistribution(absl::Span<const float> logits,
                                         const gpu::SamplingParams& params);

// The outcome of verifying k drafts: the first `accepted` drafts are kept,
// then `next` (the target's correction at the first rejected position, or
// the bonus token after k accepted drafts) follows them: accepted + 1 new
// tokens in all.
struct Verdict {
  int accepted = 0;
  int64_t next = 0;
};

// Greedy verification: the longest prefix of drafts equal to the target's
// argmax at its position (target_logits row j: the distribution after the
// anchor and drafts[0, j)), then the target's argmax after it.
// target_logits [k + 1, vocab] (row-major), drafts k ids.
Verdict VerifyGreedy(absl::Span<const float> target_logits, int64_t vocab,
                     absl::Span<const int64_t> drafts);

// Sampling verification of k drafts drawn from the draft distributions
// `draft` [k][vocab] against the target's `target` [k + 1][vocab] (both
// SamplingDistribution of their logits under the request's sampling
// parameters), with the uniforms of `seed` (the same seed gives the same
// verdict on every rank). Preserves the target distribution: the committed
// tokens are distributed as if drawn from the target one by one.
Verdict VerifySampled(const std::vector<std::vector<double>>& target,
                      const std::vector<std::vector<double>>& draft,
                      absl::Span<const int64_t> drafts, VerifyRule rule,
                      uint64_t seed);

}  // namespace mneme::model

#endif  // MNEME_MODEL_SPEC_VERIFY_H_
