#include "model/layers/compressor.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::model {

using gpu::ConstMatrixView;
using gpu::MatrixView;

int64_t CompressorWeights::StateRows() const {
  if (ratio <= 1) return 0;
  const int64_t c = overlap ? 2 : 1;
  return 2 * StateBlocks() * ratio * c;
}

absl::StatusOr<CompressorWeights> LoadCompressorWeights(
    WeightLoader& load, const std::string& prefix, const ModelDims& dims,
    int ratio, int64_t dim, bool overlap, bool with_ape) {
  const int64_t D = dims.hidden_size;
  CompressorWeights w;
  w.ratio = ratio;
  w.overlap = overlap;
  w.dim = dim;
  ASSIGN_OR_RETURN(w.wkv, load.Linear(prefix + "wkv", w.width(), D));
  if (ratio > 1) {
    ASSIGN_OR_RETURN(w.wgate, load.Linear(prefix + "wgate", w.width(), D));
  } else if (load.Has(prefix + "wgate.weight")) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "wgate.weight: a ratio-1 compressor has no gate"));
  }
  if (with_ape) {
    ASSIGN_OR_RETURN(w.ape, load.Vector(prefix + "ape", {ratio, w.width()}));
  } else if (load.Has(prefix + "ape")) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "ape: this architecture's compressor has no position bias"));
  }
  ASSIGN_OR_RETURN(w.norm, load.Vector(prefix + "norm.weight", {dim}));
  return w;
}

absl::Status CompressorProject(const LayerContext& ctx,
                               const CompressorWeights& w, ConstMatrixView xn,
                               absl::Span<const int32_t> positions,
                               MatrixView kv, MatrixView score) {
  gpu::Backend& backend = ctx.backend;
  const int64_t T = xn.rows, cw = w.width();
  backend.Linear(xn, *w.wkv, kv);
  if (w.wgate == nullptr) return absl::OkStatus();
  backend.Linear(xn, *w.wgate, score);
  if (w.ape == nullptr) return absl::OkStatus();
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer bias, ctx.workspace.Take(T * cw));
  std::vector<int32_t> rows(T);
  for (int64_t t = 0; t < T; ++t) rows[t] = positions[t] % w.ratio;
  backend.GatherRows(w.ape->view(w.ratio, cw), rows, bias.view(T, cw));
  backend.Add(score, bias.view(T, cw), score);
  return absl::OkStatus();
}

absl::Status CompressChunk(const LayerContext& ctx, const CompressorWeights& w,
                           KvCache& cache, const std::vector<int32_t>& state,
                           ConstMatrixView kv, ConstMatrixView score,
                           int64_t t0, int64_t p0, int64_t n,
                           const std::function<bool(int64_t)>& want,
                           const EntrySink& sink) {
  gpu::Backend& backend = ctx.backend;
  Workspace& ws = ctx.workspace;
  const int64_t m = w.ratio, d = w.dim, cw = w.width();
  const float eps = ctx.dims.rms_norm_eps;
  Workspace::Scope scope(ws);
  if (m == 1) {
    // Every token is an entry: norm(wkv(x)).
    int64_t j = 0;
    while (j < n) {
      if (!want(p0 + j)) {
        ++j;
        continue;
      }
      int64_t k = j;
      while (k < n && want(p0 + k)) ++k;
      ASSIGN_OR_RETURN(WorkBuffer e, ws.Take((k - j) * d));
      backend.CopyColumns(
          gpu::ConstMatrixView(kv.data + (t0 + j) * cw, k - j, cw), 0,
          e.view(k - j, d));
      backend.RmsNorm(e.view(k - j, d), w.norm->data(), eps, e.view(k - j, d));
      RETURN_IF_ERROR(sink(p0 + j, k - j, e.view(k - j, d)));
      j = k;
    }
    return absl::OkStatus();
  }
  const MatrixView pool = cache.pool();
  const int64_t hd = pool.cols;
  const int64_t c = w.overlap ? 2 : 1;
  const int64_t nb = w.StateBlocks();
  const int64_t slots = nb * m;
  auto row = [&](int kind, int64_t slot, int64_t half) {
    return cache.Row(state, (kind * slots + slot) * c + half);
  };
  ASSIGN_OR_RETURN(WorkBuffer staged, ws.TakeZeroed(2 * c * hd));
  ASSIGN_OR_RETURN(WorkBuffer gathered, ws.Take(2 * m * hd));
  ASSIGN_OR_RETURN(WorkBuffer pooled_kv, ws.Take(2 * m * d));
  ASSIGN_OR_RETURN(WorkBuffer pooled_score, ws.Take(2 * m * d));
  ASSIGN_OR_RETURN(WorkBuffer zeros, ws.TakeZeroed(2 * m * d));
  ASSIGN_OR_RETURN(WorkBuffer entry, ws.Take(d));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    const int64_t block = p / m;
    const int64_t slot = p % slots;
    // Store the token's halves (kv, then score) as pool rows.
    std::vector<int32_t> dst;
    for (int kind = 0; kind < 2; ++kind) {
      const float* src = (kind == 0 ? kv.data : score.data) + (t0 + j) * cw;
      for (int64_t h = 0; h < c; ++h) {
        backend.PlaceColumns(gpu::ConstMatrixView(src + h * d, 1, d),
                             Rows(staged.view(2 * c, hd), kind * c + h, 1), 0);
        dst.push_back(row(kind, slot, h));
      }
    }
    backend.ScatterRows(staged.view(2 * c, hd), dst, pool);
    if (p % m != m - 1 || !want(block)) continue;
    // Slots of the entry: the previous block's first halves (overlap, not
    // for block 0), then this block's (second halves with overlap).
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<int32_t> rows;
      if (w.overlap && block > 0) {
        const int64_t prev = ((block - 1) % nb) * m;
        for (int64_t i = 0; i < m; ++i) rows.push_back(row(kind, prev + i, 0));
      }
      const int64_t cur = (block % nb) * m;
      for (int64_t i = 0; i < m; ++i) {
        rows.push_back(row(kind, cur + i, w.overlap ? 1 : 0));
      }
      const int64_t k = static_cast<int64_t>(rows.size());
      backend.GatherRows(pool, rows, gathered.view(k, hd));
      backend.CopyColumns(gathered.view(k, hd), 0,
                          (kind == 0 ? pooled_kv : pooled_score).view(k, d));
    }
    const int64_t k = (w.overlap && block > 0 ? 2 : 1) * m;
    backend.SoftmaxPool(pooled_kv.view(k, d), pooled_score.view(k, d),
                        zeros.view(k, d), entry.view(1, d));
    backend.RmsNorm(entry.view(1, d), w.norm->data(), eps, entry.view(1, d));
    RETURN_IF_ERROR(sink(block, 1, entry.view(1, d)));
  }
  return absl::OkStatus();
}

}  // namespace mneme::model
