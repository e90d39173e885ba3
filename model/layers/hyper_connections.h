#ifndef MNEME_MODEL_LAYERS_HYPER_CONNECTIONS_H_
#define MNEME_MODEL_LAYERS_HYPER_CONNECTIONS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/layers/layer_context.h"
#include "model/weight_loader.h"
#include "model/workspace.h"

namespace mneme::model {

// Hyper-connections (the reference's hc_pre / hc_post / hc_head): the
// residual stream holds hc_mult (>= 2) copies of each token, mixed before
// and after every sub-layer. V4 collapses the copies before a sub-layer with
// that sub-layer's own pre mix; V4.1 with the mix the previous sub-layer
// computed (the staggered single pass: attention uses the previous layer's
// FFN mix, the FFN this layer's attention mix, layer 0 copy 0).
//
// The weights of one mixing point: fn [rows, hc * D], base [rows], scale.
struct HcWeights {
  std::unique_ptr<gpu::Weight> fn;
  std::unique_ptr<gpu::Buffer> base, scale;
};

// Loads `prefix`_fn, `prefix`_base and `prefix`_scale of a sub-layer's
// mixing ((2 + hc) * hc rows, 3 scales), e.g. prefix "layers.0.hc_attn".
absl::StatusOr<HcWeights> LoadHcSublayerWeights(WeightLoader& load,
                                                const std::string& prefix,
                                                const ModelDims& dims);
// The head's: `prefix`"hc_head_fn" [hc, hc * D], "hc_head_base",
// "hc_head_scale" (prefix "" for the model's, "mtp.S." for a V4 DSpark
// stage's).
absl::StatusOr<HcWeights> LoadHcHeadWeights(WeightLoader& load,
                                            const ModelDims& dims,
                                            const std::string& prefix = "");

// The per-step buffers of the mixing ([T, D], [T, hc], [T, hc], [T, hc *
// hc]).
struct HcScratch {
  WorkBuffer x, pre, post, comb;
};
absl::StatusOr<HcScratch> TakeHcScratch(Workspace& workspace, int64_t tokens,
                                        const ModelDims& dims);

// Before a sub-layer: its mix (scratch.pre, .post, .comb) from the stream
// [T, hc * D].
void HcMix(const LayerContext& ctx, const HcWeights& w,
           gpu::ConstMatrixView stream, const HcScratch& scratch);
// The sub-layer's input scratch.x [T, D]: the copies of the stream weighted
// by pre [T, hc].
gpu::MatrixView HcCollapse(const LayerContext& ctx, gpu::ConstMatrixView stream,
                           gpu::ConstMatrixView pre, const HcScratch& scratch);
// After a sub-layer with output a [T, D]: folds it into the stream.
void HcPost(const LayerContext& ctx, gpu::ConstMatrixView a,
            const HcScratch& scratch, gpu::MatrixView stream);
// The head's combination of the copies: x [R, D] from xs [R, hc * D].
void HcHead(const LayerContext& ctx, const HcWeights& w,
            gpu::ConstMatrixView xs, gpu::MatrixView x);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_HYPER_CONNECTIONS_H_
