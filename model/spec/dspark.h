#ifndef MNEME_MODEL_SPEC_DSPARK_H_
#define MNEME_MODEL_SPEC_DSPARK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "model/kv_cache.h"
#include "model/layers/embedding_head.h"
#include "model/layers/hyper_connections.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/workspace.h"

namespace mneme::model {

struct DsparkOptions {
  // Checkpoint directory of the target (the stages are its mtp.* tensors).
  std::string checkpoint_dir;
  // This rank and the tensor-parallel group size (the target's).
  int tp_rank = 0;
  int tp_size = 1;
  // Backend bytes for the stages' window rings of every sequence (each
  // sequence takes num_draft_layers * sliding_window rows of head_dim
  // floats, rounded up to whole blocks). Default: 64 MiB.
  int64_t ring_budget_bytes = int64_t{64} << 20;
};

// One sequence's proposal request: the anchor (the token the target
// sampled after the sequence's last committed position) and how the drafts
// are drawn (greedy: temperature 0; the seed of draft i is seed + i).
struct DraftRequest {
  uint64_t sequence_id = 0;
  int64_t anchor = 0;
  gpu::SamplingParams sampling;
};

// What the drafter proposes for one sequence: block_size() drafts, the
// Markov-corrected draft logits each was drawn from ([block_size, vocab],
// the draft distribution the verifier compares with the target's) and the
// confidence head's logits (sigmoid: the chance that draft i survives when
// the drafts before it did).
struct DraftProposal {
  std::vector<int64_t> tokens;
  std::vector<float> logits;
  std::vector<float> confidence;
};

// The seed of a step's drafts from the step's sampling seed (draft i is
// drawn with the result + i): a hash, so that consecutive steps, whose
// seeds differ by the few tokens generated, draw unrelated streams.
uint64_t DraftSeed(uint64_t step_seed);

// How many of the first `k` drafts a step may carry: those before the first
// id the target's Engram layers cannot take (>= engram_vocab_size, when
// that is > 0; Model::engram_vocab_size).
int UsableDrafts(absl::Span<const int64_t> drafts, int k,
                 int64_t engram_vocab_size);

// The DSpark drafter of DeepSeek-V4.1-Flash (../shared/docs/MODEL_V41.md
// section 2; the official inference/model.py DSparkBlock, DSparkAttention,
// DSparkMarkovHead, DSparkConfidenceHead and Transformer.forward_spec) on
// one tensor-parallel rank; and of V4-Flash-0731, whose stages are V4
// blocks (each sub-layer collapses the copies with its own mix, queries are
// re-normalised per head) and whose last stage collapses with its own
// hc_head before the norm (MODEL_V41.md 1.8: lower confidence).
//
// The target's taps at committed positions (StepOutput::taps) become
// main_x = main_norm(main_proj(taps)), and each stage keeps the window
// (sliding_window positions) of kv_norm(wkv(main_x)), rotated at the
// position, in its own ring: Extend(). Propose() runs the block [anchor,
// noise x (block_size - 1)] at the positions after the last committed one
// through the stages (V4.1 blocks: staggered hyper-connections, window
// attention over the stage's ring plus every block position, the stages'
// MoE), collapses the last stage with its FFN mix, applies its norm and the
// target's head, then adds the Markov head's bias of the previous token
// and draws draft i, serially. The block's own keys are never kept.
//
// Under tensor parallelism the heads, experts and vocabulary are split as
// in the target, the rings are replicated, and every rank draws the same
// drafts (the logits are gathered and the seeds shared). Decode context
// parallelism does not split the drafter: each rank attends over its own
// copy of the window.
//
// Thread-compatible: the step loop that owns the target owns it.
class DsparkDrafter {
 public:
  // Loads the stages. `shared` and `vocab` are the target's embedding/head
  // and this rank's vocabulary rows (borrowed; they must outlive the
  // drafter); `comm` is required when tp_size > 1. InvalidArgument when
  // the checkpoint has no DSpark stages (V4-Flash's MTP block is not a
  // drafter here); the loader's errors.
  static absl::StatusOr<std::unique_ptr<DsparkDrafter>> Create(
      const DsparkOptions& options, const ModelDims& dims,
      gpu::Backend& backend, gpu::Communicator* comm,
      const EmbeddingHeadWeights& shared, const VocabShard& vocab);
  ~DsparkDrafter();

  int block_size() const { return dims_.dspark_block_size; }
  const ModelDims& dims() const { return dims_; }
  // Committed positions the drafter has seen of a sequence; -1 if unknown.
  int64_t SequenceLength(uint64_t sequence_id) const;

  // Adds committed positions [first, first + count) of a sequence from the
  // target's taps of the last m of them (host fp32 [m, taps *
  // hidden_size], min(count, sliding_window) <= m <= count; only the last
  // sliding_window positions reach the rings). `first` must be the
  // sequence's length (0 for a new sequence). InvalidArgument for a gap or
  // a wrong size (nothing changes); ResourceExhausted when the rings are
  // full for a new sequence.
  absl::Status Extend(uint64_t sequence_id, int64_t first, int64_t count,
                      absl::Span<const float> taps);
  // The drafts of every request's sequence (each extended by >= 1
  // position), at positions length .. length + block_size - 1. Changes no
  // state. InvalidArgument for an unknown sequence, a repeated one or an
  // anchor outside the vocabulary.
  absl::StatusOr<std::vector<DraftProposal>> Propose(
      absl::Span<const DraftRequest> requests);
  // Forgets a sequence (no-op if unknown).
  void Release(uint64_t sequence_id);
  // Forgets every sequence.
  void ReleaseAll();

 private:
  struct SequenceRings {
    int64_t length = 0;
    std::vector<std::vector<int32_t>> rings;  // Blocks, per stage.
  };

  DsparkDrafter(const DsparkOptions& options, ModelDims dims,
                gpu::Backend& backend, gpu::Communicator* comm,
                const EmbeddingHeadWeights& shared, const VocabShard& vocab);
  absl::Status Load();
  LayerContext Context();
  // out [R, D] = the attention of stage s for the block rows xn [R, D] of
  // `requests` (block_size rows each, at `positions`).
  absl::Status StageAttention(const LayerContext& ctx, int s,
                              absl::Span<const DraftRequest> requests,
                              const std::vector<int32_t>& positions,
                              gpu::ConstMatrixView xn, gpu::MatrixView out);

  const DsparkOptions options_;
  // The target's dims with the stages' MoE and window-only attention:
  // "layer" s is stage s.
  const ModelDims dims_;
  gpu::Backend& backend_;
  gpu::Communicator* const comm_;
  const EmbeddingHeadWeights& shared_;
  const VocabShard vocab_;
  std::vector<LayerWeights> stages_;
  std::unique_ptr<gpu::Weight> main_proj_;
  std::unique_ptr<gpu::Buffer> main_norm_, norm_;
  // V4-Flash-0731: the last stage's head mix.
  HcWeights hc_head_;
  std::unique_ptr<gpu::Weight> markov_embed_, markov_head_, confidence_;
  std::unique_ptr<KvCache> rings_;
  std::unique_ptr<Workspace> workspace_;
  absl::flat_hash_map<uint64_t, SequenceRings> sequences_;
};

}  // namespace mneme::model

#endif  // MNEME_MODEL_SPEC_DSPARK_H_
