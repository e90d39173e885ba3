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

// Rows of token halves a compressor pools in one pass, with the state rows
// the pass reads (a bound on its workspace whatever the step's chunks):
// 4096 rows of a 512-wide cache. Also the rows of a piece of state writes.
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

int64_t CompressorStepWorkspaceFloats(int ratio, bool overlap, int64_t dim,
                                      int64_t pool_cols, int64_t n) {
  const auto f = [](int64_t floats) { return WorkspaceFloats(floats); };
  const int64_t m = std::max(ratio, 1);
  // The sink's entries, their copy and their widened rows.
  const auto sink = [&](int64_t count) {
    return f(count * dim) + 2 * f(count * pool_cols);
  };
  if (m == 1) return f(n * dim) + f(n * dim) + sink(n);
  const int64_t c = overlap ? 2 : 1;
  // A pass's pooled rows and the state rows it reads: at most
  // kMaxPooledRows, or its first entry's (fewer than 3 c m); and fewer than
  // 3 c m an entry, an entry at most a token of the step.
  const int64_t rows =
      std::min(std::max(kMaxPooledRows, 3 * c * m), 3 * c * m * n);
  const int64_t count = rows / m;  // An entry pools at least m rows.
  // The pooled rows; per kind the state rows as read and the rows the
  // pooled ones are gathered from; or the entries and the sink.
  const int64_t pass =
      2 * f(rows * dim) + std::max(f(rows * pool_cols) + f(rows * dim),
                                   f(count * dim) + sink(count));
  // The state writes: a piece of the rows and their widened copy.
  const int64_t piece = std::min(kMaxPooledRows, c * n);
  const int64_t states = f(piece * dim) + f(piece * pool_cols);
  return f(c * m * dim) + std::max(pass, states);
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

CompressorStep::CompressorStep(const LayerContext& ctx,
                               const CompressorWeights& w, KvCache& cache,
                               ConstMatrixView kv, ConstMatrixView score)
    : ctx_(ctx), w_(w), cache_(cache), src_{kv, score} {}

int32_t CompressorStep::StateRow(const Chunk& chunk, int kind, int64_t slot,
                                 int64_t half) const {
  const int64_t c = w_.overlap ? 2 : 1;
  const int64_t slots = w_.StateBlocks() * w_.ratio;
  return cache_.Row(*chunk.state, (kind * slots + slot) * c + half);
}

void CompressorStep::Add(int32_t chunk, const std::vector<int32_t>& state,
                         int64_t t0, int64_t p0, int64_t n,
                         const std::function<bool(int64_t)>& want) {
  if (static_cast<size_t>(chunk) >= chunks_.size()) {
    chunks_.resize(static_cast<size_t>(chunk) + 1);
  }
  Chunk& ch = chunks_[chunk];
  ch = Chunk{.state = &state, .t0 = t0, .p0 = p0};
  const int64_t m = w_.ratio;
  if (m <= 1) {
    // Every token is an entry.
    for (int64_t p = p0; p < p0 + n; ++p) {
      if (want(p)) jobs_.push_back(Job{.chunk = chunk, .block = p});
    }
    return;
  }
  // The blocks the chunk completes (block b ends at (b + 1) m - 1).
  for (int64_t b = p0 / m; b < (p0 + n) / m; ++b) {
    if (want(b)) jobs_.push_back(Job{.chunk = chunk, .block = b});
  }
  // The state keeps the chunk's last `slots` tokens (earlier ones would be
  // overwritten by later ones of the chunk).
  const int64_t c = w_.overlap ? 2 : 1;
  const int64_t slots = w_.StateBlocks() * m;
  const int64_t kept = std::min(n, slots);
  for (int kind = 0; kind < 2; ++kind) {
    for (int64_t i = n - kept; i < n; ++i) {
      for (int64_t h = 0; h < c; ++h) {
        state_src_[kind].push_back(static_cast<int32_t>((t0 + i) * c + h));
        state_dst_[kind].push_back(StateRow(ch, kind, (p0 + i) % slots, h));
      }
    }
  }
}

absl::Status CompressorStep::Finish(const EntrySink& sink) {
  if (w_.ratio <= 1) return FinishRatioOne(sink);
  RETURN_IF_ERROR(Pool(sink));
  return WriteStates();
}

absl::Status CompressorStep::FinishRatioOne(const EntrySink& sink) {
  if (jobs_.empty()) return absl::OkStatus();
  gpu::Backend& backend = ctx_.backend;
  Workspace& ws = ctx_.workspace;
  Workspace::Scope scope(ws);
  const int64_t d = w_.dim, cw = w_.width();
  const auto k = static_cast<int64_t>(jobs_.size());
  // The entries norm(wkv(x)) of the wanted tokens.
  std::vector<CompletedEntry> entries(k);
  std::vector<int32_t> rows(k);
  bool in_a_row = true;
  for (int64_t i = 0; i < k; ++i) {
    const Job& job = jobs_[i];
    const Chunk& ch = chunks_[job.chunk];
    entries[i] = CompletedEntry{.chunk = job.chunk, .entry = job.block};
    rows[i] = static_cast<int32_t>(ch.t0 + job.block - ch.p0);
    in_a_row = in_a_row && rows[i] == rows[0] + i;
  }
  ASSIGN_OR_RETURN(WorkBuffer e, ws.Take(k * d));
  if (in_a_row) {
    backend.CopyColumns(Rows(src_[0], rows[0], k), 0, e.view(k, d));
  } else {
    ASSIGN_OR_RETURN(WorkBuffer picked, ws.Take(k * cw));
    backend.GatherRows(src_[0], rows, picked.view(k, cw));
    backend.CopyColumns(picked.view(k, cw), 0, e.view(k, d));
  }
  backend.RmsNorm(e.view(k, d), w_.norm->data(), ctx_.dims.rms_norm_eps,
                  e.view(k, d));
  return sink(entries, e.view(k, d));
}

absl::Status CompressorStep::Pool(const EntrySink& sink) {
  if (jobs_.empty()) return absl::OkStatus();
  gpu::Backend& backend = ctx_.backend;
  Workspace& ws = ctx_.workspace;
  const int64_t m = w_.ratio, d = w_.dim;
  const MatrixView pool = cache_.pool();
  const int64_t hd = pool.cols;
  const int64_t c = w_.overlap ? 2 : 1;
  const int64_t slots = w_.StateBlocks() * m;
  Workspace::Scope scope(ws);
  // The step's token halves: row t * c + h is half h of token t.
  const ConstMatrixView halves[2] = {
      ConstMatrixView(src_[0].data, src_[0].rows * c, d),
      ConstMatrixView(src_[1].data, src_[1].rows * c, d)};
  // An entry pools the previous block's first halves (overlap, not for
  // block 0), then its own block's (second halves with overlap).
  const auto entry_rows = [&](int64_t b) {
    return (w_.overlap && b > 0 ? 2 : 1) * m;
  };
  const auto first_needed = [&](int64_t b) {
    return std::max<int64_t>(0, (b - (w_.overlap ? 1 : 0)) * m);
  };
  // The halves of the tokens before its chunk that a job needs when it is
  // its chunk's first in a pass (the chunk's later jobs need none earlier).
  const auto state_halves = [&](const Job& job) {
    return std::max<int64_t>(0,
                             chunks_[job.chunk].p0 - first_needed(job.block)) *
           c;
  };
  const auto first_of_chunk = [&](size_t g, size_t g0) {
    return g == g0 || jobs_[g - 1].chunk != jobs_[g].chunk;
  };
  // The ape argument of the pooling: the scores already hold ape.
  ASSIGN_OR_RETURN(WorkBuffer zeros, ws.TakeZeroed(c * m * d));
  // Jobs [g0, g1) in one pass, g1 where the pooled rows and the state rows
  // read would pass kMaxPooledRows: a bounded workspace whatever the step.
  for (size_t g0 = 0; g0 < jobs_.size();) {
    size_t g1 = g0;
    int64_t pooled_rows = 0, read_rows = 0;
    while (g1 < jobs_.size()) {
      const int64_t k = entry_rows(jobs_[g1].block);
      const int64_t pre = first_of_chunk(g1, g0) ? state_halves(jobs_[g1]) : 0;
      if (g1 > g0 && pooled_rows + read_rows + k + pre > kMaxPooledRows) break;
      pooled_rows += k;
      read_rows += pre;
      ++g1;
    }
    const size_t pass_begin = g0;
    g0 = g1;
    Workspace::Scope pass_scope(ws);
    // The pooled rows, in order: rows of `all` = [the state rows read (per
    // kind, pool rows pre[kind]); the step's halves step_rows], a step row s
    // noted as -1 - s until the state rows are counted.
    std::vector<int32_t> idx;
    idx.reserve(pooled_rows);
    std::vector<int32_t> pre[2], step_rows;
    int64_t base = 0, offset = 0;
    for (size_t g = pass_begin; g < g1; ++g) {
      const Job& job = jobs_[g];
      const Chunk& ch = chunks_[job.chunk];
      if (first_of_chunk(g, pass_begin)) {
        // Positions [base, p0) of the chunk's sequence from its state.
        base = std::min(first_needed(job.block), ch.p0);
        offset = static_cast<int64_t>(pre[0].size());
        for (int64_t q = base; q < ch.p0; ++q) {
          for (int64_t h = 0; h < c; ++h) {
            for (int kind = 0; kind < 2; ++kind) {
              pre[kind].push_back(StateRow(ch, kind, q % slots, h));
            }
          }
        }
      }
      const auto add = [&](int64_t q, int64_t h) {
        if (q < ch.p0) {
          idx.push_back(static_cast<int32_t>(offset + (q - base) * c + h));
        } else {
          idx.push_back(static_cast<int32_t>(-1 - step_rows.size()));
          step_rows.push_back(
              static_cast<int32_t>((ch.t0 + q - ch.p0) * c + h));
        }
      };
      const int64_t b = job.block;
      if (w_.overlap && b > 0) {
        for (int64_t q = (b - 1) * m; q < b * m; ++q) add(q, 0);
      }
      for (int64_t q = b * m; q < (b + 1) * m; ++q) add(q, c - 1);
    }
    const auto read = static_cast<int64_t>(pre[0].size());
    const auto own = static_cast<int64_t>(step_rows.size());
    for (int32_t& i : idx) {
      if (i < 0) i = static_cast<int32_t>(read + (-1 - i));
    }
    ASSIGN_OR_RETURN(WorkBuffer pooled_kv, ws.Take(pooled_rows * d));
    ASSIGN_OR_RETURN(WorkBuffer pooled_score, ws.Take(pooled_rows * d));
    const MatrixView pooled[2] = {pooled_kv.view(pooled_rows, d),
                                  pooled_score.view(pooled_rows, d)};
    for (int kind = 0; kind < 2; ++kind) {
      if (read == 0) {
        backend.GatherRows(halves[kind], step_rows, pooled[kind]);
        continue;
      }
      Workspace::Scope kind_scope(ws);
      ASSIGN_OR_RETURN(WorkBuffer all, ws.Take((read + own) * d));
      if (hd == d) {
        backend.GatherRows(pool, pre[kind], all.view(read, d));
      } else {
        ASSIGN_OR_RETURN(WorkBuffer wide, ws.Take(read * hd));
        backend.GatherRows(pool, pre[kind], wide.view(read, hd));
        backend.CopyColumns(wide.view(read, hd), 0, all.view(read, d));
      }
      if (own > 0) {
        backend.GatherRows(halves[kind], step_rows,
                           MatrixView{all.data() + read * d, own, d});
      }
      backend.GatherRows(all.view(read + own, d), idx, pooled[kind]);
    }
    const auto count = static_cast<int64_t>(g1 - pass_begin);
    std::vector<CompletedEntry> entries(count);
    for (int64_t i = 0; i < count; ++i) {
      const Job& job = jobs_[pass_begin + i];
      entries[i] = CompletedEntry{.chunk = job.chunk, .entry = job.block};
    }
    ASSIGN_OR_RETURN(WorkBuffer out, ws.Take(count * d));
    // Block 0 with overlap pools m rows, every other entry c m: one call
    // for each run of equal rows.
    int64_t done = 0, row = 0;
    while (done < count) {
      const int64_t k = entry_rows(entries[done].entry);
      int64_t run = 1;
      while (done + run < count && entry_rows(entries[done + run].entry) == k) {
        ++run;
      }
      backend.SoftmaxPool(Rows(pooled[0], row, run * k),
                          Rows(pooled[1], row, run * k), zeros.view(k, d),
                          MatrixView{out.data() + done * d, run, d});
      done += run;
      row += run * k;
    }
    backend.RmsNorm(out.view(count, d), w_.norm->data(), ctx_.dims.rms_norm_eps,
                    out.view(count, d));
    RETURN_IF_ERROR(sink(entries, out.view(count, d)));
  }
  return absl::OkStatus();
}

absl::Status CompressorStep::WriteStates() {
  const int64_t c = w_.overlap ? 2 : 1, d = w_.dim;
  for (int kind = 0; kind < 2; ++kind) {
    const std::vector<int32_t>& from = state_src_[kind];
    const std::vector<int32_t>& to = state_dst_[kind];
    // The step's token halves: row t * c + h is half h of token t.
    const ConstMatrixView halves(src_[kind].data, src_[kind].rows * c, d);
    // At most kMaxPooledRows rows a piece (a bounded workspace).
    for (size_t b = 0; b < from.size(); b += kMaxPooledRows) {
      const auto k = static_cast<int64_t>(
          std::min<size_t>(kMaxPooledRows, from.size() - b));
      const absl::Span<const int32_t> piece =
          absl::MakeConstSpan(from).subspan(b, k);
      Workspace::Scope scope(ctx_.workspace);
      bool in_a_row = true;
      for (int64_t i = 1; i < k && in_a_row; ++i) {
        in_a_row = piece[i] == piece.front() + i;
      }
      ConstMatrixView rows;
      if (in_a_row) {
        rows = Rows(halves, piece.front(), k);
      } else {
        // Rows of several chunks, gathered first.
        ASSIGN_OR_RETURN(WorkBuffer picked, ctx_.workspace.Take(k * d));
        ctx_.backend.GatherRows(halves, piece, picked.view(k, d));
        rows = picked.view(k, d);
      }
      RETURN_IF_ERROR(WritePoolRows(ctx_, cache_.pool(), rows,
                                    absl::MakeConstSpan(to).subspan(b, k)));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::model
