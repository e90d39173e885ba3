#include "model/layers/compressor.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/workspace.h"

namespace mneme::model {

using gpu::ConstMatrixView;
using gpu::MatrixView;

namespace {

// Rows of token halves a compressor pools in one pass (a bound on its
// workspace whatever the chunk): 4096 rows of a 512-wide cache.
constexpr int64_t kMaxPooledRows = 4096;

}  // namespace

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

int64_t CompressChunkWorkspaceFloats(int ratio, bool overlap, int64_t dim,
                                     int64_t pool_cols, int64_t n) {
  const auto f = [](int64_t floats) { return WorkspaceFloats(floats); };
  const int64_t m = std::max(ratio, 1);
  // The sink's entries, their copy and their widened rows.
  const auto sink = [&](int64_t count) {
    return f(count * dim) + 2 * f(count * pool_cols);
  };
  if (m == 1) return f(n * dim) + f(n * dim) + sink(n);
  const int64_t c = overlap ? 2 : 1;
  // A pass pools at most this many rows, and `count` entries.
  const int64_t pooled = std::min(std::max(kMaxPooledRows, c * m), c * (n + m));
  const int64_t count = pooled / m + 1;
  // The tokens before the chunk (fewer than 2 m) and the chunk's up to the
  // pass's end, as halves.
  const int64_t pre = 2 * m * c;
  const int64_t halves =
      f(pre * pool_cols) + f((pre + pooled + 2 * c * m) * dim);
  // WriteStates: a piece of the rows and their widened copy (after the
  // passes; only the pooling's zero ape may still be held).
  const int64_t piece = std::min(kMaxPooledRows, c * n);
  const int64_t states = f(piece * dim) + f(piece * pool_cols);
  return f(c * m * dim) +
         std::max(2 * f(pooled * dim) + std::max(halves, sink(count)), states);
}

absl::Status WritePoolRows(const LayerContext& ctx, MatrixView pool,
                           ConstMatrixView rows,
                           absl::Span<const int32_t> dst) {
  if (rows.rows == 0) return absl::OkStatus();
  if (rows.cols == pool.cols) {
    ctx.backend.ScatterRows(rows, dst, pool);
    return absl::OkStatus();
  }
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer wide,
                   ctx.workspace.TakeZeroed(rows.rows * pool.cols));
  ctx.backend.PlaceColumns(rows, wide.view(rows.rows, pool.cols), 0);
  ctx.backend.ScatterRows(wide.view(rows.rows, pool.cols), dst, pool);
  return absl::OkStatus();
}

absl::Status CompressChunk(const LayerContext& ctx, const CompressorWeights& w,
                           KvCache& cache, const std::vector<int32_t>& state,
                           ConstMatrixView kv, ConstMatrixView score,
                           int64_t t0, int64_t p0, int64_t n,
                           const std::function<bool(int64_t)>& want,
                           const EntrySink& sink, StateWrites* deferred) {
  gpu::Backend& backend = ctx.backend;
  Workspace& ws = ctx.workspace;
  const int64_t m = w.ratio, d = w.dim, cw = w.width();
  const float eps = ctx.dims.rms_norm_eps;
  Workspace::Scope scope(ws);
  if (m == 1) {
    // Every token is an entry: norm(wkv(x)).
    std::vector<int64_t> entries;
    std::vector<int32_t> rows;
    for (int64_t j = 0; j < n; ++j) {
      if (!want(p0 + j)) continue;
      entries.push_back(p0 + j);
      rows.push_back(static_cast<int32_t>(t0 + j));
    }
    if (entries.empty()) return absl::OkStatus();
    const auto k = static_cast<int64_t>(entries.size());
    ASSIGN_OR_RETURN(WorkBuffer e, ws.Take(k * d));
    if (k == n) {
      backend.CopyColumns(ConstMatrixView(kv.data + t0 * cw, n, cw), 0,
                          e.view(k, d));
    } else {
      ASSIGN_OR_RETURN(WorkBuffer picked, ws.Take(k * cw));
      backend.GatherRows(kv, rows, picked.view(k, cw));
      backend.CopyColumns(picked.view(k, cw), 0, e.view(k, d));
    }
    backend.RmsNorm(e.view(k, d), w.norm->data(), eps, e.view(k, d));
    return sink(entries, e.view(k, d));
  }
  const MatrixView pool = cache.pool();
  const int64_t hd = pool.cols;
  const int64_t c = w.overlap ? 2 : 1;
  const int64_t slots = w.StateBlocks() * m;
  // The state's pool row of half h of the token in `slot`, kind 0 the
  // projections, 1 the scores.
  const auto state_row = [&](int kind, int64_t slot, int64_t half) {
    return cache.Row(state, (kind * slots + slot) * c + half);
  };
  const ConstMatrixView src[2] = {kv, score};
  // The chunk's token halves in place: a row [t, cw] is its c halves of d,
  // so row i * c + h of this view is half h of position p0 + i.
  const auto chunk_halves = [&](int kind) {
    return ConstMatrixView(src[kind].data + t0 * cw, n * c, d);
  };

  // The entries the chunk completes (block b ends at (b + 1) m - 1) that
  // are wanted. They are pooled before the chunk's tokens are written to the
  // state, whose slots may hold tokens before p0 that they need.
  std::vector<int64_t> blocks;
  for (int64_t b = p0 / m; b < (p0 + n) / m; ++b) {
    if (want(b)) blocks.push_back(b);
  }
  // An entry pools the previous block's first halves (overlap, not for
  // block 0), then its own block's (second halves with overlap).
  const auto entry_rows = [&](int64_t b) {
    return (w.overlap && b > 0 ? 2 : 1) * m;
  };
  // The ape argument of the pooling: the scores already hold ape.
  WorkBuffer zeros;
  if (!blocks.empty()) {
    ASSIGN_OR_RETURN(zeros, ws.TakeZeroed(c * m * d));
  }
  // The entries of blocks [g0, g1) in one pass, g1 where the pooled rows
  // would pass kMaxPooledRows or the halves the pass reads (its positions
  // from the first one its first entry needs, c halves each) would pass
  // kMaxPooledRows + 2 c m (sparse under DCP): a bounded workspace whatever
  // the chunk.
  const auto first_needed = [&](int64_t b) {
    return std::max<int64_t>(0, (b - (w.overlap ? 1 : 0)) * m);
  };
  for (size_t g0 = 0; g0 < blocks.size();) {
    size_t g1 = g0;
    int64_t pooled_rows = 0;
    const int64_t start = first_needed(blocks[g0]);
    while (
        g1 < blocks.size() &&
        (g1 == g0 ||
         (pooled_rows + entry_rows(blocks[g1]) <= kMaxPooledRows &&
          ((blocks[g1] + 1) * m - start) * c <= kMaxPooledRows + 2 * c * m))) {
      pooled_rows += entry_rows(blocks[g1]);
      ++g1;
    }
    const absl::Span<const int64_t> group =
        absl::MakeConstSpan(blocks).subspan(g0, g1 - g0);
    g0 = g1;
    Workspace::Scope group_scope(ws);
    // The rows are the positions' halves from `base` to the group's end,
    // those before p0 from the state.
    const int64_t base = std::min(start, p0);
    const int64_t before = p0 - base;
    const int64_t end = (group.back() + 1) * m;
    std::vector<int32_t> idx;
    idx.reserve(pooled_rows);
    for (const int64_t b : group) {
      if (w.overlap && b > 0) {
        for (int64_t q = (b - 1) * m; q < b * m; ++q) {
          idx.push_back(static_cast<int32_t>((q - base) * c));
        }
      }
      for (int64_t q = b * m; q < (b + 1) * m; ++q) {
        idx.push_back(static_cast<int32_t>((q - base) * c + c - 1));
      }
    }
    const auto count = static_cast<int64_t>(group.size());
    ASSIGN_OR_RETURN(WorkBuffer pooled_kv, ws.Take(pooled_rows * d));
    ASSIGN_OR_RETURN(WorkBuffer pooled_score, ws.Take(pooled_rows * d));
    const MatrixView pooled[2] = {pooled_kv.view(pooled_rows, d),
                                  pooled_score.view(pooled_rows, d)};
    for (int kind = 0; kind < 2; ++kind) {
      Workspace::Scope halves_scope(ws);
      ConstMatrixView halves = chunk_halves(kind);
      if (before > 0) {
        // The positions before p0 from the state, then the chunk's up to
        // the group's end: one matrix of halves from `base` on.
        std::vector<int32_t> rows;
        for (int64_t q = base; q < p0; ++q) {
          for (int64_t h = 0; h < c; ++h) {
            rows.push_back(state_row(kind, q % slots, h));
          }
        }
        const int64_t pre = before * c, own = (end - p0) * c;
        ASSIGN_OR_RETURN(WorkBuffer wide, ws.Take(pre * hd));
        ASSIGN_OR_RETURN(WorkBuffer all, ws.Take((pre + own) * d));
        backend.GatherRows(pool, rows, wide.view(pre, hd));
        backend.CopyColumns(wide.view(pre, hd), 0, all.view(pre, d));
        backend.CopyColumns(Rows(chunk_halves(kind), 0, own), 0,
                            MatrixView{all.data() + pre * d, own, d});
        halves = all.view(pre + own, d);
      }
      backend.GatherRows(halves, idx, pooled[kind]);
    }
    ASSIGN_OR_RETURN(WorkBuffer out, ws.Take(count * d));
    // Block 0 with overlap pools m rows, every other entry c m: one call
    // for each run of equal rows.
    int64_t done = 0, row = 0;
    while (done < count) {
      const int64_t k = entry_rows(group[done]);
      int64_t run = 1;
      while (done + run < count && entry_rows(group[done + run]) == k) ++run;
      backend.SoftmaxPool(Rows(pooled[0], row, run * k),
                          Rows(pooled[1], row, run * k), zeros.view(k, d),
                          MatrixView{out.data() + done * d, run, d});
      done += run;
      row += run * k;
    }
    backend.RmsNorm(out.view(count, d), w.norm->data(), eps,
                    out.view(count, d));
    RETURN_IF_ERROR(sink(group, out.view(count, d)));
  }

  // The state keeps the chunk's last `slots` tokens (earlier ones would be
  // overwritten by later ones of the chunk).
  const int64_t kept = std::min(n, slots);
  StateWrites own;
  StateWrites& writes = deferred != nullptr ? *deferred : own;
  for (int kind = 0; kind < 2; ++kind) {
    for (int64_t i = n - kept; i < n; ++i) {
      for (int64_t h = 0; h < c; ++h) {
        writes.src[kind].push_back(static_cast<int32_t>((t0 + i) * c + h));
        writes.dst[kind].push_back(state_row(kind, (p0 + i) % slots, h));
      }
    }
  }
  if (deferred != nullptr) return absl::OkStatus();
  return WriteStates(ctx, w, cache, kv, score, own);
}

absl::Status WriteStates(const LayerContext& ctx, const CompressorWeights& w,
                         KvCache& cache, ConstMatrixView kv,
                         ConstMatrixView score, const StateWrites& writes) {
  if (w.ratio <= 1) return absl::OkStatus();
  const int64_t c = w.overlap ? 2 : 1, d = w.dim;
  const ConstMatrixView src[2] = {kv, score};
  for (int kind = 0; kind < 2; ++kind) {
    const std::vector<int32_t>& from = writes.src[kind];
    const std::vector<int32_t>& to = writes.dst[kind];
    // The step's token halves: row t * c + h is half h of token t.
    const ConstMatrixView halves(src[kind].data, src[kind].rows * c, d);
    // At most kMaxPooledRows rows a piece (a bounded workspace).
    for (size_t b = 0; b < from.size(); b += kMaxPooledRows) {
      const auto k = static_cast<int64_t>(
          std::min<size_t>(kMaxPooledRows, from.size() - b));
      const absl::Span<const int32_t> piece =
          absl::MakeConstSpan(from).subspan(b, k);
      Workspace::Scope scope(ctx.workspace);
      bool in_a_row = true;
      for (int64_t i = 1; i < k && in_a_row; ++i) {
        in_a_row = piece[i] == piece.front() + i;
      }
      ConstMatrixView rows;
      if (in_a_row) {
        rows = Rows(halves, piece.front(), k);
      } else {
        // Rows of several chunks, gathered first.
        ASSIGN_OR_RETURN(WorkBuffer picked, ctx.workspace.Take(k * d));
        ctx.backend.GatherRows(halves, piece, picked.view(k, d));
        rows = picked.view(k, d);
      }
      RETURN_IF_ERROR(WritePoolRows(ctx, cache.pool(), rows,
                                    absl::MakeConstSpan(to).subspan(b, k)));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::model
