#include "model/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/dcp_merge.h"

namespace mneme::model {

using gpu::ConstMatrixView;
using gpu::MatrixView;

absl::StatusOr<AttentionWeights> LoadAttentionWeights(WeightLoader& load,
                                                      const std::string& prefix,
                                                      const ModelDims& dims,
                                                      int ratio, int tp_rank,
                                                      int tp_size) {
  const ModelDims& d = dims;
  const int rank = tp_rank;
  const int64_t D = d.hidden_size, hd = d.head_dim;
  const int64_t heads_local = d.num_heads / tp_size;
  const int64_t groups_local = d.o_groups / tp_size;
  const int64_t heads_per_group = d.num_heads / d.o_groups;
  const std::string& a = prefix;
  AttentionWeights w;
  ASSIGN_OR_RETURN(w.wq_a, load.Linear(a + "wq_a", d.q_lora_rank, D));
  ASSIGN_OR_RETURN(w.q_norm, load.Vector(a + "q_norm.weight", {d.q_lora_rank}));
  ASSIGN_OR_RETURN(
      w.wq_b, load.Linear(a + "wq_b", d.num_heads * hd, d.q_lora_rank,
                          Slice{rank * heads_local * hd, heads_local * hd}));
  ASSIGN_OR_RETURN(w.wkv, load.Linear(a + "wkv", hd, D));
  ASSIGN_OR_RETURN(w.kv_norm, load.Vector(a + "kv_norm.weight", {hd}));
  w.wo_a.resize(groups_local);
  for (int64_t g = 0; g < groups_local; ++g) {
    ASSIGN_OR_RETURN(
        w.wo_a[g],
        load.Linear(
            a + "wo_a", d.o_groups * d.o_lora_rank, heads_per_group * hd,
            Slice{(rank * groups_local + g) * d.o_lora_rank, d.o_lora_rank}));
  }
  ASSIGN_OR_RETURN(w.wo_b,
                   load.Linear(a + "wo_b", D, d.o_groups * d.o_lora_rank, {},
                               Slice{rank * groups_local * d.o_lora_rank,
                                     groups_local * d.o_lora_rank}));
  ASSIGN_OR_RETURN(w.attn_sink, load.Vector(a + "attn_sink", {d.num_heads},
                                            rank * heads_local, heads_local));
  if (ratio > 0) {
    ASSIGN_OR_RETURN(CompressorWeights c,
                     LoadCompressorWeights(load, a + "compressor.", d, ratio));
    w.compressor = std::make_unique<CompressorWeights>(std::move(c));
  }
  return w;
}

absl::Status GatherHeads(const LayerContext& ctx, ConstMatrixView q_local,
                         MatrixView q_all) {
  const int n = ctx.tp_size;
  const int64_t T = q_local.rows, w = q_local.cols;
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer recv, ctx.workspace.Take(n * T * w));
  RETURN_IF_ERROR(ctx.comm->AllGather(q_local.data, T * w, recv.data()));
  // recv is [rank][token][w]; q_all is [token][rank][w].
  std::vector<int32_t> rows(n * T);
  for (int64_t t = 0; t < T; ++t) {
    for (int q = 0; q < n; ++q)
      rows[t * n + q] = static_cast<int32_t>(q * T + t);
  }
  ctx.backend.GatherRows(recv.view(n * T, w), rows,
                         MatrixView{q_all.data, n * T, w});
  return absl::OkStatus();
}

namespace {

// Attention of one chunk's queries (rows [t0, t0 + n) of q) over its keys:
// this rank's compressed entries, then the window positions it attends
// (all of them, or with DCP the ones it owns): earlier tokens from the
// window ring, this chunk's from kv. Then remembers the chunk's last window
// tokens in the ring.
absl::Status ChunkAttention(const LayerContext& ctx, const AttentionWeights& w,
                            int ratio, KvCache& cache,
                            SequenceState::LayerState& ls, int64_t n_entries,
                            int64_t t0, int64_t p0, int64_t n, MatrixView q,
                            int64_t heads, MatrixView kv, MatrixView o_att,
                            MatrixView lse) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int64_t hd = d.head_dim;
  const int r = ratio;
  const int W = d.sliding_window;
  const bool dcp = ctx.dcp.enabled();
  const MatrixView pool = cache.pool();
  Workspace::Scope scope(ctx.workspace);
  const int64_t first_prev = p0 - std::min<int64_t>(p0, W - 1);
  std::vector<int64_t> window_pos;
  for (int64_t p = first_prev; p < p0 + n; ++p) {
    if (!dcp || ctx.dcp.OwnsEntry(p)) window_pos.push_back(p);
  }
  const int64_t K = n_entries + static_cast<int64_t>(window_pos.size());
  ASSIGN_OR_RETURN(WorkBuffer keys, ctx.workspace.Take(K * hd));
  // Keys [0, m) come from the pool (the entries, then the earlier window
  // positions, which sort first), keys [m, K) from this chunk's kv rows.
  std::vector<int32_t> pool_rows, chunk_rows;
  for (int64_t e = 0; e < n_entries; ++e) {
    pool_rows.push_back(cache.Row(ls.entries, e));
  }
  for (int64_t p : window_pos) {
    if (p < p0) {
      pool_rows.push_back(cache.Row(ls.window, p % W));
    } else {
      chunk_rows.push_back(static_cast<int32_t>(t0 + p - p0));
    }
  }
  const int64_t m = static_cast<int64_t>(pool_rows.size());
  const MatrixView keys_view = keys.view(K, hd);
  if (m > 0) backend.GatherRows(pool, pool_rows, Rows(keys_view, 0, m));
  if (K > m) backend.GatherRows(kv, chunk_rows, Rows(keys_view, m, K - m));
  std::vector<gpu::KeyRanges> ranges(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    if (r > 0) {
      ranges[j].end[0] =
          static_cast<int32_t>(ctx.dcp.OwnedEntriesBefore((p + 1) / r));
    }
    const int64_t lo = std::max<int64_t>(0, p - W + 1);
    ranges[j].begin[1] = static_cast<int32_t>(
        n_entries +
        (std::lower_bound(window_pos.begin(), window_pos.end(), lo) -
         window_pos.begin()));
    ranges[j].end[1] = static_cast<int32_t>(
        n_entries + (std::upper_bound(window_pos.begin(), window_pos.end(), p) -
                     window_pos.begin()));
  }
  backend.Attention(Rows(q, t0, n), keys_view, static_cast<int>(heads), ranges,
                    1.0f / std::sqrt(static_cast<float>(hd)),
                    dcp ? nullptr : w.attn_sink->data(), Rows(o_att, t0, n),
                    Rows(lse, t0, n));
  // Remember the last W tokens of the chunk in the window ring.
  std::vector<int32_t> src_rows, dst_rows;
  for (int64_t p = std::max(p0, p0 + n - W); p < p0 + n; ++p) {
    src_rows.push_back(static_cast<int32_t>(t0 + p - p0));
    dst_rows.push_back(cache.Row(ls.window, p % W));
  }
  const int64_t tail_rows = static_cast<int64_t>(src_rows.size());
  ASSIGN_OR_RETURN(WorkBuffer tail, ctx.workspace.Take(tail_rows * hd));
  backend.GatherRows(kv, src_rows, tail.view(tail_rows, hd));
  backend.ScatterRows(tail.view(tail_rows, hd), dst_rows, pool);
  return absl::OkStatus();
}

// out = wo_b(wo_a per head group(o)): o [T, hl * hd] -> out [T, D].
absl::Status OutputProjection(const LayerContext& ctx,
                              const AttentionWeights& w, MatrixView o,
                              MatrixView out) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int64_t T = o.rows, hd = d.head_dim;
  const int64_t gl = static_cast<int64_t>(w.wo_a.size());
  const int64_t gw = (d.num_heads / d.o_groups) * hd;  // Inputs per group.
  const int64_t ol = d.o_lora_rank;
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer oa, ctx.workspace.Take(T * gl * ol));
  if (gl == 1) {
    backend.Linear(MatrixView{o.data, T, gw}, *w.wo_a[0], oa.view(T, ol));
  } else {
    ASSIGN_OR_RETURN(WorkBuffer gin, ctx.workspace.Take(T * gw));
    ASSIGN_OR_RETURN(WorkBuffer gout, ctx.workspace.Take(T * ol));
    std::vector<int32_t> rows(T);
    for (int64_t g = 0; g < gl; ++g) {
      for (int64_t t = 0; t < T; ++t) {
        rows[t] = static_cast<int32_t>(t * gl + g);
      }
      backend.GatherRows(MatrixView{o.data, T * gl, gw}, rows, gin.view(T, gw));
      backend.Linear(gin.view(T, gw), *w.wo_a[g], gout.view(T, ol));
      backend.ScatterRows(gout.view(T, ol), rows, oa.view(T * gl, ol));
    }
  }
  backend.Linear(oa.view(T, gl * ol), *w.wo_b, out);
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionForward(const LayerContext& ctx,
                              const AttentionWeights& w, int layer,
                              KvCache& cache, const StepBatch& batch,
                              ConstMatrixView xn, MatrixView out) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  Workspace& ws = ctx.workspace;
  const int64_t T = xn.rows, hd = d.head_dim, ql = d.q_lora_rank;
  const int64_t hl = d.num_heads / ctx.tp_size;
  const int r = d.compress_ratios[layer];
  const auto fwd = gpu::Backend::RopeDirection::kForward;
  const std::vector<int32_t>& positions = batch.positions;
  Workspace::Scope scope(ws);

  ASSIGN_OR_RETURN(WorkBuffer qa, ws.Take(T * ql));
  backend.Linear(xn, *w.wq_a, qa.view(T, ql));
  backend.RmsNorm(qa.view(T, ql), w.q_norm->data(), d.rms_norm_eps,
                  qa.view(T, ql));
  ASSIGN_OR_RETURN(WorkBuffer q, ws.Take(T * hl * hd));
  backend.Linear(qa.view(T, ql), *w.wq_b, q.view(T, hl * hd));
  backend.Rope(q.view(T, hl * hd), static_cast<int>(hd), d.rope_dim,
               d.rope_theta, positions, fwd);
  ASSIGN_OR_RETURN(WorkBuffer kv, ws.Take(T * hd));
  backend.Linear(xn, *w.wkv, kv.view(T, hd));
  backend.RmsNorm(kv.view(T, hd), w.kv_norm->data(), d.rms_norm_eps,
                  kv.view(T, hd));
  backend.Rope(kv.view(T, hd), static_cast<int>(hd), d.rope_dim, d.rope_theta,
               positions, fwd);
  WorkBuffer ckv, cscore;
  if (r > 0) {
    ASSIGN_OR_RETURN(ckv, ws.Take(T * hd));
    ASSIGN_OR_RETURN(cscore, ws.Take(T * hd));
    CompressorProject(ctx, *w.compressor, xn, ckv.view(T, hd),
                      cscore.view(T, hd));
  }
  // With DCP every rank attends with all heads over the entries it owns and
  // the partial results are merged across ranks; otherwise each rank
  // attends with its own heads over every entry.
  const bool dcp = ctx.dcp.enabled();
  const int64_t heads = dcp ? d.num_heads : hl;
  MatrixView qv = q.view(T, hl * hd);
  if (dcp) {
    ASSIGN_OR_RETURN(WorkBuffer q_all, ws.Take(T * d.num_heads * hd));
    RETURN_IF_ERROR(
        GatherHeads(ctx, q.view(T, hl * hd), q_all.view(T, d.num_heads * hd)));
    qv = q_all.view(T, heads * hd);
  }
  ASSIGN_OR_RETURN(WorkBuffer o_att, ws.Take(T * heads * hd));
  ASSIGN_OR_RETURN(WorkBuffer lse, ws.Take(T * heads));

  int64_t t0 = 0;
  for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
    const SequenceChunk& c = batch.input.chunks[ci];
    SequenceState::LayerState& ls = batch.seqs[ci]->layers[layer];
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    const int64_t p0 = c.start_position;
    int64_t n_entries = 0;  // This rank's entries after the chunk.
    if (r > 0) {
      ASSIGN_OR_RETURN(n_entries, CompressChunk(ctx, *w.compressor, r, cache,
                                                ls, ckv.view(T, hd),
                                                cscore.view(T, hd), t0, p0, n));
    }
    RETURN_IF_ERROR(ChunkAttention(
        ctx, w, r, cache, ls, n_entries, t0, p0, n, qv, heads, kv.view(T, hd),
        o_att.view(T, heads * hd), lse.view(T, heads)));
    t0 += n;
  }
  MatrixView o = o_att.view(T, hl * hd);
  if (dcp) {
    ASSIGN_OR_RETURN(WorkBuffer mine, ws.Take(T * hl * hd));
    RETURN_IF_ERROR(MergeAttention(
        backend, *ctx.comm, ws, o_att.view(T, heads * hd), lse.view(T, heads),
        w.attn_sink->data(), mine.view(T, hl * hd)));
    o = mine.view(T, hl * hd);
  }
  backend.Rope(o, static_cast<int>(hd), d.rope_dim, d.rope_theta, positions,
               gpu::Backend::RopeDirection::kInverse);
  RETURN_IF_ERROR(OutputProjection(ctx, w, o, out));
  return ctx.AllReduce(out);
}

}  // namespace mneme::model
