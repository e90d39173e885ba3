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

// The official Indexer of one layer on one rank: query heads from the
// attention's low-rank query (wq_b), per-head weights (weights_proj) and
// one key per compressed entry; score_j = sum_h w_h relu(q_h . k_j); the
// top index_topk visible entries are attended. V4 layers (ratio 4) compress
// their own keys (an overlapping compressor of index_head_dim); V4.1 keys
// are k_norm(wk(entry)) made by the kv source layers (wk, k_norm present
// there). The Hadamard rotation the official code applies to both sides
// cancels in exact arithmetic (it is orthogonal) and is left out.
struct IndexerWeights {
  std::unique_ptr<gpu::Weight> wq_b, weights_proj;  // This rank's heads.
  std::unique_ptr<CompressorWeights> compressor;    // V4.
};

// The official Attention of one layer on one rank: low-rank queries of the
// rank's heads (V4: re-normalised per head), one shared key/value row per
// token (K = V), a sliding window of recent tokens plus the selected
// compressed entries, a per-head sink, inverse RoPE on the output, and the
// grouped low-rank output projection (partial sums over the group).
//
// With decode context parallelism (ctx.dcp) every rank attends with every
// head over the entries and window positions it owns, and the partial
// results are merged by log-sum-exp (model/dcp_merge.h); the indexer's
// scores of every rank's entries are gathered so that all ranks select the
// same entries.
struct AttentionWeights {
  std::unique_ptr<gpu::Weight> wq_a, wq_b, wkv, wo_b;
  // One per local head group.
  std::vector<std::unique_ptr<gpu::Weight>> wo_a;
  std::unique_ptr<gpu::Buffer> q_norm, kv_norm, attn_sink;
  // The layer's RoPE inverse frequencies (ModelDims::RopeFrequencies).
  std::vector<double> rope;
  // Present when the layer compresses (ModelDims::HasCompressor).
  std::unique_ptr<CompressorWeights> compressor;
  // Present when the layer runs an indexer (ModelDims::HasIndexer).
  std::unique_ptr<IndexerWeights> indexer;
  // V4.1 kv sources: the index key projection of their entries.
  std::unique_ptr<gpu::Weight> index_wk;
  std::unique_ptr<gpu::Buffer> index_k_norm;
};

// Loads `prefix` ("layers.<l>.attn.") of main layer `layer`.
absl::StatusOr<AttentionWeights> LoadAttentionWeights(WeightLoader& load,
                                                      const std::string& prefix,
                                                      const ModelDims& dims,
                                                      int layer, int tp_rank,
                                                      int tp_size);

// What the layers of one step hand down (V4.1): per chunk, the last index
// source's selection (each query's entries, ascending) and the candidate
// source's candidate blocks.
struct StepSelections {
  struct Chunk {
    std::vector<std::vector<int32_t>> selected;
    std::vector<std::vector<int32_t>> candidate_blocks;  // Ascending.
    bool has_selection = false;
    bool has_candidates = false;
  };
  std::vector<Chunk> chunks;
};

// out [T, D] = this rank's part of the attention of xn [T, D] (summed over
// the group), reading and extending each chunk's cache state (whose blocks
// the caller reserved). Errors: the communicator's and the workspace's.
absl::Status AttentionForward(const LayerContext& ctx,
                              const AttentionWeights& w, int layer,
                              KvCache& cache, const StepBatch& batch,
                              StepSelections& shared, gpu::ConstMatrixView xn,
                              gpu::MatrixView out);

// The attention's projections of xn [T, D] at `positions`: qa [T, q_lora]
// = q_norm(wq_a(xn)) (the indexer reads it), q [T, local heads * head_dim]
// = wq_b(qa) (V4: each head re-normalised), rotated, and the shared
// key/value row kv [T, head_dim] = kv_norm(wkv(xn)), rotated.
void ProjectQueryKv(const LayerContext& ctx, const AttentionWeights& w,
                    gpu::ConstMatrixView xn,
                    absl::Span<const int32_t> positions, gpu::MatrixView qa,
                    gpu::MatrixView q, gpu::MatrixView kv);

// out [T, D] = this rank's part of wo_b(wo_a per head group(o)) for the
// attention output o [T, local heads * head_dim] (a partial sum: the caller
// all-reduces). Errors: the workspace's.
absl::Status OutputProjection(const LayerContext& ctx,
                              const AttentionWeights& w, gpu::MatrixView o,
                              gpu::MatrixView out);

// DCP: every rank's query heads q_all [T, n * w] (token-major) from this
// rank's q_local [T, w]. Collective.
absl::Status GatherHeads(const LayerContext& ctx, gpu::ConstMatrixView q_local,
                         gpu::MatrixView q_all);

// The entries a query at position p selects from full indexer scores
// (`scores`, one per entry of the cache): the top min(topk, visible) of the
// visible entries e < visible (restricted to `candidate_blocks` of
// `block_size` entries, ascending, when not null), higher score first, the
// lower index on ties, a NaN after every number; returned ascending. The
// rule of Backend::SelectTopK (gpu::SelectTopEntries).
std::vector<int32_t> SelectEntries(absl::Span<const float> scores,
                                   int64_t visible, int topk,
                                   const std::vector<int32_t>* candidate_blocks,
                                   int block_size);

// The official select_candidate_blocks for one query: blocks of
// `block_size` entries score as the max over their visible entries (e <
// visible), the block holding the newest visible entry is always kept, and
// the top `topk_blocks` blocks with a finite score are returned ascending.
std::vector<int32_t> SelectCandidateBlocks(absl::Span<const float> scores,
                                           int64_t visible, int topk_blocks,
                                           int block_size);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_ATTENTION_H_
