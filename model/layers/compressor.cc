#include "model/layers/compressor.h"

#include <vector>

#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<CompressorWeights> LoadCompressorWeights(
    WeightLoader& load, const std::string& prefix, const ModelDims& dims,
    int ratio) {
  const int64_t D = dims.hidden_size, hd = dims.head_dim;
  CompressorWeights w;
  ASSIGN_OR_RETURN(w.wkv, load.Linear(prefix + "wkv", hd, D));
  ASSIGN_OR_RETURN(w.wgate, load.Linear(prefix + "wgate", hd, D));
  ASSIGN_OR_RETURN(w.ape, load.Vector(prefix + "ape", {ratio, hd}));
  ASSIGN_OR_RETURN(w.norm, load.Vector(prefix + "norm.weight", {hd}));
  return w;
}

void CompressorProject(const LayerContext& ctx, const CompressorWeights& w,
                       gpu::ConstMatrixView xn, gpu::MatrixView kv,
                       gpu::MatrixView score) {
  ctx.backend.Linear(xn, *w.wkv, kv);
  ctx.backend.Linear(xn, *w.wgate, score);
}

absl::StatusOr<int64_t> CompressChunk(
    const LayerContext& ctx, const CompressorWeights& w, int ratio,
    KvCache& cache, SequenceState::LayerState& state, gpu::ConstMatrixView kv,
    gpu::ConstMatrixView score, int64_t t0, int64_t p0, int64_t n) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int r = ratio;
  const int64_t hd = d.head_dim;
  const gpu::MatrixView pool = cache.pool();
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer entry, ctx.workspace.Take(hd));
  ASSIGN_OR_RETURN(WorkBuffer pool_kv, ctx.workspace.Take(r * hd));
  ASSIGN_OR_RETURN(WorkBuffer pool_score, ctx.workspace.Take(r * hd));
  std::vector<int32_t> kv_rows(r), score_rows(r);
  for (int j = 0; j < r; ++j) {
    kv_rows[j] = cache.Row(state.partial, j);
    score_rows[j] = cache.Row(state.partial, r + j);
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    const int slot = static_cast<int>(p % r);
    backend.ScatterRows(gpu::ConstMatrixView(kv.data + (t0 + j) * hd, 1, hd),
                        {kv_rows[slot]}, pool);
    backend.ScatterRows(gpu::ConstMatrixView(score.data + (t0 + j) * hd, 1, hd),
                        {score_rows[slot]}, pool);
    if (slot != r - 1) continue;
    const int64_t e = p / r;
    if (!ctx.dcp.OwnsEntry(e)) continue;
    backend.GatherRows(pool, kv_rows, pool_kv.view(r, hd));
    backend.GatherRows(pool, score_rows, pool_score.view(r, hd));
    backend.SoftmaxPool(pool_kv.view(r, hd), pool_score.view(r, hd),
                        w.ape->view(r, hd), entry.view(1, hd));
    backend.RmsNorm(entry.view(1, hd), w.norm->data(), d.rms_norm_eps,
                    entry.view(1, hd));
    const int32_t entry_pos = static_cast<int32_t>(e * r);
    backend.Rope(entry.view(1, hd), static_cast<int>(hd), d.rope_dim,
                 d.rope_theta, {entry_pos},
                 gpu::Backend::RopeDirection::kForward);
    backend.ScatterRows(
        entry.view(1, hd),
        {cache.Row(state.entries, ctx.dcp.OwnedEntriesBefore(e))}, pool);
  }
  return ctx.dcp.OwnedEntriesBefore((p0 + n) / r);
}

}  // namespace mneme::model
