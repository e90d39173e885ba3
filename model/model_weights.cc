#include "model/model_weights.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(
    WeightLoader& load, const ModelDims& dims, const VocabShard& vocab,
    const EngramLayout& engram, int tp_rank, int tp_size) {
  const int64_t D = dims.hidden_size;
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->embedding_head,
                   LoadEmbeddingHeadWeights(load, dims, vocab));
  w->layers.resize(dims.num_layers);
  for (int l = 0; l < dims.num_layers; ++l) {
    LayerWeights& lw = w->layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    ASSIGN_OR_RETURN(lw.attn_norm, load.Vector(p + "attn_norm.weight", {D}));
    ASSIGN_OR_RETURN(lw.ffn_norm, load.Vector(p + "ffn_norm.weight", {D}));
    ASSIGN_OR_RETURN(lw.hc_attn,
                     LoadHcSublayerWeights(load, p + "hc_attn", dims));
    ASSIGN_OR_RETURN(lw.hc_ffn,
                     LoadHcSublayerWeights(load, p + "hc_ffn", dims));
    ASSIGN_OR_RETURN(lw.attn, LoadAttentionWeights(load, p + "attn.", dims,
                                                   dims.compress_ratios[l],
                                                   tp_rank, tp_size));
    ASSIGN_OR_RETURN(lw.ffn,
                     LoadMoeWeights(load, p + "ffn.", dims, tp_rank, tp_size));
    if (dims.IsEngramLayer(l)) {
      ASSIGN_OR_RETURN(EngramWeights e,
                       LoadEngramWeights(load, p + "engram.", dims, engram));
      lw.engram = std::make_unique<EngramWeights>(std::move(e));
    }
  }
  return w;
}

}  // namespace mneme::model
