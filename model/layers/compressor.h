#ifndef MNEME_MODEL_LAYERS_COMPRESSOR_H_
#define MNEME_MODEL_LAYERS_COMPRESSOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/kv_cache.h"
#include "model/layers/layer_context.h"
#include "model/step_io.h"
#include "model/weight_loader.h"

namespace mneme::model {

// The reference's Compressor: every `ratio` tokens of a layer with
// compress_ratio > 0 become one compressed attention entry, a softmax pool
// of their projections (plus a learned position bias), normalised and
// rotated to the block's first position.
struct CompressorWeights {
  std::unique_ptr<gpu::Weight> wkv, wgate;
  std::unique_ptr<gpu::Buffer> ape, norm;
};
// Loads `prefix` ("layers.<l>.attn.compressor.")wkv, wgate, ape, norm.weight.
absl::StatusOr<CompressorWeights> LoadCompressorWeights(
    WeightLoader& load, const std::string& prefix, const ModelDims& dims,
    int ratio);

// The compressor's projections of xn [T, D]: kv and score, [T, head_dim]
// each.
void CompressorProject(const LayerContext& ctx, const CompressorWeights& w,
                       gpu::ConstMatrixView xn, gpu::MatrixView kv,
                       gpu::MatrixView score);

// Feeds one chunk to the compressor token by token: rows [t0, t0 + n) of kv
// and score, positions [p0, p0 + n). The partial block lives in
// state.partial; each completed block becomes an entry in state.entries if
// this rank owns it (ctx.dcp), whose blocks the caller reserved. Returns
// this rank's entry count after the chunk.
absl::StatusOr<int64_t> CompressChunk(
    const LayerContext& ctx, const CompressorWeights& w, int ratio,
    KvCache& cache, SequenceState::LayerState& state, gpu::ConstMatrixView kv,
    gpu::ConstMatrixView score, int64_t t0, int64_t p0, int64_t n);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_COMPRESSOR_H_
