#include "model/layers/moe.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<MoeWeights> LoadMoeWeights(WeightLoader& load,
                                          const std::string& prefix,
                                          const ModelDims& dims, int layer,
                                          int tp_rank, int tp_size) {
  const int64_t D = dims.hidden_size, I = dims.moe_intermediate;
  const int n = tp_size, rank = tp_rank;
  const std::string& f = prefix;
  MoeWeights w;
  ASSIGN_OR_RETURN(w.gate, load.Linear(f + "gate", dims.num_experts, D));
  const bool hash = !dims.IsV41() && layer < dims.num_hash_layers;
  if (hash) {
    const int64_t k = dims.experts_per_token;
    ASSIGN_OR_RETURN(std::vector<int64_t> table,
                     load.Integers(f + "gate.tid2eid", {dims.vocab_size, k}));
    w.tid2eid.resize(table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i] < 0 || table[i] >= dims.num_experts) {
        return absl::InvalidArgumentError(
            absl::StrCat(f, "gate.tid2eid: entry ", i, " (", table[i],
                         ") is not an expert in [0, ", dims.num_experts, ")"));
      }
      w.tid2eid[i] = static_cast<int32_t>(table[i]);
    }
  } else {
    ASSIGN_OR_RETURN(w.gate_bias,
                     load.Vector(f + "gate.bias", {dims.num_experts}));
  }
  if (load.Has(f + "gate.bias_vl")) {
    RETURN_IF_ERROR(load.Check(f + "gate.bias_vl", {checkpoint::DType::kF32},
                               {dims.num_experts}));
  }
  const int64_t experts_local = dims.num_experts / n;
  w.experts.resize(experts_local);
  for (int64_t e = 0; e < experts_local; ++e) {
    const std::string x =
        absl::StrCat(f, "experts.", rank * experts_local + e, ".");
    ExpertWeights& ew = w.experts[e];
    ASSIGN_OR_RETURN(ew.w1, load.Linear(x + "w1", I, D));
    ASSIGN_OR_RETURN(ew.w3, load.Linear(x + "w3", I, D));
    ASSIGN_OR_RETURN(ew.w2, load.Linear(x + "w2", D, I));
  }
  const int64_t shared_inter = dims.num_shared_experts * I;
  if (shared_inter > 0) {
    const bool split = shared_inter % n == 0;
    const int64_t part = split ? shared_inter / n : shared_inter;
    if (split || rank == 0) {
      const Slice s{split ? rank * part : 0, part};
      const std::string x = f + "shared_experts.";
      ASSIGN_OR_RETURN(w.shared.w1, load.Linear(x + "w1", shared_inter, D, s));
      ASSIGN_OR_RETURN(w.shared.w3, load.Linear(x + "w3", shared_inter, D, s));
      ASSIGN_OR_RETURN(w.shared.w2,
                       load.Linear(x + "w2", D, shared_inter, {}, s));
    }
  }
  return w;
}

absl::Status CheckDraftMoe(const WeightLoader& load, const std::string& prefix,
                           const ModelDims& dims, int experts) {
  const int64_t D = dims.hidden_size, I = dims.moe_intermediate;
  const std::string& f = prefix;
  RETURN_IF_ERROR(load.CheckLinear(f + "gate", experts, D));
  RETURN_IF_ERROR(
      load.Check(f + "gate.bias", {checkpoint::DType::kF32}, {experts}));
  for (int e = 0; e < experts; ++e) {
    const std::string x = absl::StrCat(f, "experts.", e, ".");
    RETURN_IF_ERROR(load.CheckLinear(x + "w1", I, D));
    RETURN_IF_ERROR(load.CheckLinear(x + "w3", I, D));
    RETURN_IF_ERROR(load.CheckLinear(x + "w2", D, I));
  }
  const std::string x = f + "shared_experts.";
  RETURN_IF_ERROR(load.CheckLinear(x + "w1", I, D));
  RETURN_IF_ERROR(load.CheckLinear(x + "w3", I, D));
  return load.CheckLinear(x + "w2", D, I);
}

absl::Status MoeForward(const LayerContext& ctx, const MoeWeights& w,
                        absl::Span<const int32_t> tokens,
                        gpu::ConstMatrixView xn, gpu::MatrixView out) {
  const ModelDims& d = ctx.dims;
  const int64_t T = xn.rows, E = d.num_experts, k = d.experts_per_token;
  // This rank's experts, in one call with the routing (the CUDA backend
  // groups the assignments on the device and runs grouped GEMMs); they
  // accumulate into out.
  std::vector<gpu::ExpertRef> experts;
  experts.reserve(w.experts.size());
  for (const ExpertWeights& ew : w.experts) {
    experts.push_back(gpu::ExpertRef{
        .w1 = ew.w1.get(), .w2 = ew.w2.get(), .w3 = ew.w3.get()});
  }
  const int64_t first = ctx.tp_rank * static_cast<int64_t>(experts.size());
  gpu::MoeRouting routing;
  routing.top_k = static_cast<int>(k);
  routing.routed_scaling = d.routed_scaling;
  // Hash routing (V4's first layers): the experts listed for each token id.
  std::vector<int32_t> listed;
  if (!w.tid2eid.empty()) {
    listed.resize(T * k);
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(w.tid2eid.begin() + tokens[t] * k, k, listed.begin() + t * k);
    }
    routing.hash_experts = listed;
  } else {
    routing.bias = w.gate_bias->data();
  }
  {
    Workspace::Scope scope(ctx.workspace);
    ASSIGN_OR_RETURN(WorkBuffer logits, ctx.workspace.Take(T * E));
    ctx.backend.Linear(xn, *w.gate, logits.view(T, E));
    ctx.backend.MoeLayer(xn, logits.view(T, E), routing, first, experts,
                         d.swiglu_limit, out);
  }
  if (w.shared.w1 != nullptr) {
    std::vector<int32_t> all(T);
    for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t);
    const std::vector<float> ones(T, 1.0f);
    ctx.backend.ExpertForward(xn, all, ones, *w.shared.w1, *w.shared.w2,
                              *w.shared.w3, d.swiglu_limit, out);
  }
  return ctx.AllReduce(out);
}

}  // namespace mneme::model
