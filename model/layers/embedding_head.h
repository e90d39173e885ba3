#ifndef MNEME_MODEL_LAYERS_EMBEDDING_HEAD_H_
#define MNEME_MODEL_LAYERS_EMBEDDING_HEAD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/layers/hyper_connections.h"
#include "model/layers/layer_context.h"
#include "model/step_io.h"
#include "model/weight_loader.h"

namespace mneme::model {

// A tensor-parallel rank's rows of the vocabulary: [begin, begin + rows) of
// `shard` rows per rank (the last rank's may be shorter).
struct VocabShard {
  int64_t shard = 0;
  int64_t begin = 0;
  int64_t rows = 0;
};
// InvalidArgument when the split leaves the rank no rows.
absl::StatusOr<VocabShard> ShardVocabulary(int64_t vocab_size, int tp_rank,
                                           int tp_size);

// The reference's embed, norm, head and (V4) hc_head: the
// vocabulary-sharded embedding and output head, the final norm and the
// head's hyper-connection. V4.1 has no hc_head: the final stream is
// collapsed with the last layer's FFN mix (see Head).
struct EmbeddingHeadWeights {
  std::unique_ptr<gpu::Weight> embed, head;
  std::unique_ptr<gpu::Buffer> norm;
  HcWeights hc_head;
};
absl::StatusOr<EmbeddingHeadWeights> LoadEmbeddingHeadWeights(
    WeightLoader& load, const ModelDims& dims, const VocabShard& vocab);

// The residual stream [T, hc * D] of the step's tokens `ids`: each token's
// embedding (summed over the ranks' shards), repeated hc times.
absl::Status Embed(const LayerContext& ctx, const EmbeddingHeadWeights& w,
                   const VocabShard& vocab, absl::Span<const int32_t> ids,
                   gpu::MatrixView stream);

// Logits [R, vocab_size] of x [R, in] through a vocabulary-sharded
// projection `head` (this rank's vocab.rows rows of `in` columns), gathered
// from every rank, into backend memory `logits`. Collective with
// tp_size > 1; errors are the communicator's and the workspace's.
absl::Status VocabLogitsOnBackend(const LayerContext& ctx,
                                  const gpu::Weight& head,
                                  const VocabShard& vocab,
                                  gpu::ConstMatrixView x,
                                  gpu::MatrixView logits);

// The same logits on the host (resized).
absl::Status VocabLogits(const LayerContext& ctx, const gpu::Weight& head,
                         const VocabShard& vocab, gpu::ConstMatrixView x,
                         std::vector<float>& logits);

// The logits each chunk asks for (SequenceChunk::logits) from the final
// stream [T, hc * D], into out.logits, and the tokens drawn for chunks with
// `sample`, into out.sampled (one entry per chunk, already sized); only
// the asked-for rows come to the host. V4 collapses the copies with
// hc_head; V4.1 with `final_pre` [T, hc] (the last layer's FFN pre mix;
// unused for V4). Collective with tp_size > 1; errors are the
// communicator's.
absl::Status Head(const LayerContext& ctx, const EmbeddingHeadWeights& w,
                  const VocabShard& vocab, const StepInput& input,
                  gpu::ConstMatrixView stream, gpu::ConstMatrixView final_pre,
                  StepOutput& out);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_EMBEDDING_HEAD_H_
