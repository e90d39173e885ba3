#ifndef MNEME_GPU_SAMPLING_H_
#define MNEME_GPU_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "gpu/backend.h"

namespace mneme::gpu {

// The tokens a draw under SamplingParams may pick from one row of logits,
// as every backend's sampler defines it: weights exp((logit - max) /
// temperature) (the largest is 1; a NaN logit weighs 0), then top-k, then top-p
// of the mass top-k kept (the smallest prefix reaching it, at least one token),
// then min-p (weight < min_p dropped; the most likely token stays for min_p <=
// 1).
struct SamplingCandidates {
  // Per token of the row.
  std::vector<double> weight;
  // The kept tokens: by descending weight (equal weights: lower id first)
  // when top-k or top-p is active, else in id order.
  std::vector<int32_t> kept;
};

// Fills `out` for `row` [vocab] and returns true; returns false (and leaves
// `out` unspecified) when the draw is greedy: temperature 0, or a row whose
// largest logit is not finite. vocab >= 1.
bool FindSamplingCandidates(const float* row, int64_t vocab,
                            const SamplingParams& params,
                            SamplingCandidates& out);

// SplitMix64's first output for `seed`, as a double in [0, 1).
double SamplingUniform(uint64_t seed);

// The token a draw under `params` picks from `row` [vocab]: the lowest id of
// the largest logit when greedy, else the first kept candidate in id order
// where their cumulative weight exceeds the seeded uniform
// (SamplingUniform(params.seed)) times their weight (rounding short of it:
// the last kept candidate of positive weight). Kept candidates of no weight
// at all (min-p above 1): the lowest id of the largest logit.
int32_t SampleToken(const float* row, int64_t vocab,
                    const SamplingParams& params);

// log_softmax(row)[id] (sum in double). 0 <= id < vocab.
float LogProbOf(const float* row, int64_t vocab, int32_t id);

// Backend::MoeRoute for one token: scores sqrt(softplus(logit)), the top_k
// of score + bias (bias may be null; ties -> lower id; NaN last), their
// unbiased scores normalised to sum 1 times routed_scaling, in descending
// biased order. Reuses its buffers between calls (one caller at a time).
class MoeRouter {
 public:
  void Route(const float* logits, int64_t experts, const float* bias, int top_k,
             float routed_scaling, int32_t* expert_ids, float* weights);

 private:
  std::vector<float> score_;
  std::vector<float> biased_;
  std::vector<int32_t> order_;
};

// MoeRouting's hash routing of one token: its top_k `listed` experts, their
// weights; a repeated listing's id becomes -1 (skipped).
void HashRoute(const float* logits, absl::Span<const int32_t> listed,
               float routed_scaling, int32_t* expert_ids, float* weights);

// Backend::MoeLayer by its definition: the backend's MoeRoute (or hash
// routing on the host, over the logits copied back), then its MoeExperts.
// Shapes are the caller's to check.
void MoeLayerByParts(Backend& backend, ConstMatrixView x_all,
                     ConstMatrixView logits, const MoeRouting& routing,
                     int64_t first_expert, absl::Span<const ExpertRef> experts,
                     float limit, MatrixView y_all);

// Backend::MoeExperts' assignments by expert: expert i's are rows[offsets[i]
// .. offsets[i + 1]) (tokens) and the same range of weights, in ascending
// order of the assignment; offsets has experts + 1 entries.
struct ExpertGroups {
  std::vector<int32_t> rows;
  std::vector<float> weights;
  std::vector<int64_t> offsets;
  int64_t count(int64_t expert) const {
    return offsets[expert + 1] - offsets[expert];
  }
};
ExpertGroups GroupByExpert(absl::Span<const int32_t> expert_ids,
                           absl::Span<const float> weights, int top_k,
                           int64_t first_expert, int64_t experts);

// Backend::SelectTopK for one row of `cols` scores: the entries it chooses,
// ascending, into `out` (resized). `blocks` holds `num_blocks` candidate
// block ids (ascending; -1 padding ignored); num_blocks == 0: every entry
// below `visible` is eligible. Reuses `scratch` between calls.
void SelectTopEntries(const float* row, int64_t cols, float scale,
                      int64_t visible, int k, const int32_t* blocks,
                      int64_t num_blocks, int block_size,
                      std::vector<int32_t>& scratch, std::vector<int32_t>& out);

// Backend::SelectCandidateBlocks for one row of `cols` scores: the blocks
// it chooses, ascending, into `out` (resized). Reuses `scratch`.
void SelectTopBlocks(const float* row, int64_t cols, float scale,
                     int64_t visible, int topk_blocks, int block_size,
                     std::vector<float>& scratch, std::vector<int32_t>& out);

}  // namespace mneme::gpu

#endif  // MNEME_GPU_SAMPLING_H_
