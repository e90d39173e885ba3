#ifndef MNEME_MODEL_LAYERS_MOE_H_
#define MNEME_MODEL_LAYERS_MOE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "model/layers/layer_context.h"
#include "model/weight_loader.h"

namespace mneme::model {

// One SwiGLU expert: w1, w3 [I, D]; w2 [D, I].
struct ExpertWeights {
  std::unique_ptr<gpu::Weight> w1, w2, w3;
};

// The reference's MoE (Gate + Expert): a router over the routed experts, the
// rank's share of them (expert-parallel over the tensor-parallel ranks:
// rank r holds experts [r * E / n, (r + 1) * E / n)) and the shared experts
// (split by intermediate columns when they divide evenly, else all on rank
// 0).
struct MoeWeights {
  std::unique_ptr<gpu::Weight> gate;
  std::unique_ptr<gpu::Buffer> gate_bias;  // Null on hash layers.
  // V4 hash layers: the experts of each token id, [vocab_size *
  // experts_per_token] (ffn.gate.tid2eid).
  std::vector<int32_t> tid2eid;
  std::vector<ExpertWeights> experts;  // This rank's, by local index.
  ExpertWeights shared;                // Null members: none here.
};

// Loads `prefix` ("layers.<l>.ffn.") of main layer `layer`: gate, gate.bias
// (or on V4 hash layers gate.tid2eid; V4.1's image-token bias gate.bias_vl is
// checked and not used), experts.<e>.w{1,3,2} and shared_experts.w{1,3,2}.
absl::StatusOr<MoeWeights> LoadMoeWeights(WeightLoader& load,
                                          const std::string& prefix,
                                          const ModelDims& dims, int layer,
                                          int tp_rank, int tp_size);

// Checks the headers of a draft layer's MoE (`prefix` "mtp.<s>.ffn.") with
// `experts` routed experts, without loading it.
absl::Status CheckDraftMoe(const WeightLoader& load, const std::string& prefix,
                           const ModelDims& dims, int experts);

// out [T, D] += the MoE of xn [T, D] (summed over the group): `out` must be
// zero on entry (the experts accumulate into it). Errors are the
// communicator's or the workspace's.
// `tokens` are the step's token ids (for hash routing).
absl::Status MoeForward(const LayerContext& ctx, const MoeWeights& w,
                        absl::Span<const int32_t> tokens,
                        gpu::ConstMatrixView xn, gpu::MatrixView out);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_MOE_H_
