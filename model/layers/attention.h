#ifndef MNEME_MODEL_LAYERS_ATTENTION_H_
#define MNEME_MODEL_LAYERS_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/kv_cache.h"
#include "model/layers/compressor.h"
#include "model/layers/layer_context.h"
#include "model/step_io.h"
#include "model/weight_loader.h"

namespace mneme::model {

// The reference's Attention of one layer on one rank: low-rank queries of
// the rank's heads, one shared key/value row per token (multi-query, K = V),
// attention over the sequence's compressed entries (compress_ratio > 0, see
// compressor.h) and a sliding window of recent tokens, a per-head sink, and
// the grouped low-rank output projection (partial sums over the group).
//
// With decode context parallelism (ctx.dcp) every rank attends with every
// head over the entries and window positions it owns, and the partial
// results are merged by log-sum-exp (model/dcp_merge.h).
struct AttentionWeights {
  std::unique_ptr<gpu::Weight> wq_a, wq_b, wkv, wo_b;
  // One per local head group.
  std::vector<std::unique_ptr<gpu::Weight>> wo_a;
  std::unique_ptr<gpu::Buffer> q_norm, kv_norm, attn_sink;
  // Present when the layer's compress_ratio > 0.
  std::unique_ptr<CompressorWeights> compressor;
};
// Loads `prefix` ("layers.<l>.attn.") and the compressor of a layer with
// compress ratio `ratio` (0 = none): the rank's heads of wq_b, wo_a and the
// sink, its columns of wo_b.
absl::StatusOr<AttentionWeights> LoadAttentionWeights(WeightLoader& load,
                                                      const std::string& prefix,
                                                      const ModelDims& dims,
                                                      int ratio, int tp_rank,
                                                      int tp_size);

// out [T, D] = this rank's part of the attention of xn [T, D] (summed over
// the group), reading and extending each chunk's cache state of `layer`
// (whose blocks the caller reserved). Errors: the communicator's and the
// workspace's.
absl::Status AttentionForward(const LayerContext& ctx,
                              const AttentionWeights& w, int layer,
                              KvCache& cache, const StepBatch& batch,
                              gpu::ConstMatrixView xn, gpu::MatrixView out);

// DCP: every rank's query heads q_all [T, H * hd] (token-major) from this
// rank's q_local [T, H / tp_size * hd]. Collective.
absl::Status GatherHeads(const LayerContext& ctx, gpu::ConstMatrixView q_local,
                         gpu::MatrixView q_all);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_ATTENTION_H_
