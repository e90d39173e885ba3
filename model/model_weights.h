#ifndef MNEME_MODEL_MODEL_WEIGHTS_H_
#define MNEME_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/layers/attention.h"
#include "model/layers/embedding_head.h"
#include "model/layers/engram_layer.h"
#include "model/layers/hyper_connections.h"
#include "model/layers/moe.h"
#include "model/model_config.h"
#include "model/weight_loader.h"

namespace mneme::model {

// One decoder block (the reference's Block): the two sub-layers with their
// norms and hyper-connection mixing, and the Engram module on the layers
// that have one.
struct LayerWeights {
  std::unique_ptr<gpu::Buffer> attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights ffn;
  std::unique_ptr<EngramWeights> engram;  // Null: not an Engram layer.
};

// A tensor-parallel rank's share of every weight of the model.
struct ModelWeights {
  EmbeddingHeadWeights embedding_head;
  std::vector<LayerWeights> layers;
};

// Loads the rank's weights in checkpoint order (embedding and head, then
// layer by layer). `engram` is read only when dims has Engram layers.
// Errors: the loader's (NotFound, InvalidArgument, DataLoss), the first one.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(
    WeightLoader& load, const ModelDims& dims, const VocabShard& vocab,
    const EngramLayout& engram, int tp_rank, int tp_size);

// Checks the headers (names, dtypes, shapes) of the draft layers (V4's MTP
// block, the DSpark stages of V4-Flash-0731 and V4.1) without loading them:
// the drafter is not run here, but a checkpoint with a broken draft is
// refused at load. NotFound / InvalidArgument naming the tensor.
absl::Status CheckDraftLayers(const WeightLoader& load, const ModelDims& dims);

}  // namespace mneme::model

#endif  // MNEME_MODEL_MODEL_WEIGHTS_H_
