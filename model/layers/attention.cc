#include "model/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "gpu/sampling.h"
#include "model/dcp_merge.h"
#include "model/layers/attention_keys.h"

namespace mneme::model {

using gpu::ConstMatrixView;
using gpu::MatrixView;

namespace {

// Indexer scores held at once (queries x entries): 64 MiB of workspace.
constexpr int64_t kMaxScoreFloats = int64_t{16} << 20;

}  // namespace

absl::StatusOr<AttentionWeights> LoadAttentionWeights(WeightLoader& load,
                                                      const std::string& prefix,
                                                      const ModelDims& dims,
                                                      int layer, int tp_rank,
                                                      int tp_size) {
  const ModelDims& d = dims;
  const int rank = tp_rank;
  const int64_t D = d.hidden_size, hd = d.head_dim;
  const int64_t heads_local = d.num_heads / tp_size;
  const int64_t groups_local = d.o_groups / tp_size;
  const int64_t heads_per_group = d.num_heads / d.o_groups;
  const int ratio = d.compress_ratios[layer];
  const std::string& a = prefix;
  AttentionWeights w;
  w.rope = d.RopeFrequencies(layer);
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
  const bool v41 = d.IsV41();
  if (d.HasCompressor(layer)) {
    ASSIGN_OR_RETURN(
        CompressorWeights c,
        LoadCompressorWeights(load, a + "compressor.", d, ratio, hd,
                              /*overlap=*/!v41 && ratio == 4,
                              /*with_ape=*/!v41));
    w.compressor = std::make_unique<CompressorWeights>(std::move(c));
  } else if (load.Has(a + "compressor.wkv.weight")) {
    return absl::InvalidArgumentError(
        absl::StrCat(a, "compressor.wkv.weight: layer ", layer,
                     " is not a kv source layer and has no compressor in this "
                     "architecture"));
  }
  const std::string ix = a + "indexer.";
  if (d.HasIndexer(layer)) {
    const int64_t nI = d.index_heads, dI = d.index_head_dim;
    const int64_t hl = nI / tp_size;
    auto iw = std::make_unique<IndexerWeights>();
    ASSIGN_OR_RETURN(iw->wq_b, load.Linear(ix + "wq_b", nI * dI, d.q_lora_rank,
                                           Slice{rank * hl * dI, hl * dI}));
    ASSIGN_OR_RETURN(iw->weights_proj, load.Linear(ix + "weights_proj", nI, D,
                                                   Slice{rank * hl, hl}));
    if (!v41) {
      ASSIGN_OR_RETURN(CompressorWeights c,
                       LoadCompressorWeights(load, ix + "compressor.", d, ratio,
                                             dI, /*overlap=*/ratio == 4,
                                             /*with_ape=*/true));
      iw->compressor = std::make_unique<CompressorWeights>(std::move(c));
    }
    w.indexer = std::move(iw);
  } else if (load.Has(ix + "wq_b.weight")) {
    return absl::InvalidArgumentError(
        absl::StrCat(ix, "wq_b.weight: layer ", layer,
                     " has no indexer in this architecture"));
  }
  if (v41 && d.HasCompressor(layer)) {
    ASSIGN_OR_RETURN(w.index_wk, load.Linear(ix + "wk", d.index_head_dim, hd));
    ASSIGN_OR_RETURN(w.index_k_norm,
                     load.Vector(ix + "k_norm.weight", {d.index_head_dim}));
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

std::vector<int32_t> SelectEntries(absl::Span<const float> scores,
                                   int64_t visible, int topk,
                                   const std::vector<int32_t>* candidate_blocks,
                                   int block_size) {
  if (candidate_blocks != nullptr && candidate_blocks->empty()) return {};
  std::vector<int32_t> scratch;
  std::vector<int32_t> out;
  gpu::SelectTopEntries(
      scores.data(), static_cast<int64_t>(scores.size()), 1.0f, visible, topk,
      candidate_blocks != nullptr ? candidate_blocks->data() : nullptr,
      candidate_blocks != nullptr
          ? static_cast<int64_t>(candidate_blocks->size())
          : 0,
      block_size, scratch, out);
  return out;
}

std::vector<int32_t> SelectCandidateBlocks(absl::Span<const float> scores,
                                           int64_t visible, int topk_blocks,
                                           int block_size) {
  std::vector<float> scratch;
  std::vector<int32_t> out;
  gpu::SelectTopBlocks(scores.data(), static_cast<int64_t>(scores.size()), 1.0f,
                       visible, topk_blocks, block_size, scratch, out);
  return out;
}

namespace {

// Writes rows [k, d] (d <= the pool width), the entries `entries` (k of
// them, each owned by this rank), to their pool rows of `blocks`.
absl::Status StoreEntries(
    const LayerContext& ctx, KvCache& cache,
    const std::function<const std::vector<int32_t>&(int32_t chunk)>& blocks,
    absl::Span<const CompletedEntry> entries, ConstMatrixView rows) {
  std::vector<int32_t> dst(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    dst[i] = cache.Row(blocks(entries[i].chunk),
                       ctx.dcp.OwnedEntriesBefore(entries[i].entry));
  }
  return WritePoolRows(ctx, cache.pool(), rows, dst);
}

// Positions of `entries` at ratio `r`: e * r.
std::vector<int32_t> EntryPositions(absl::Span<const CompletedEntry> entries,
                                    int r) {
  std::vector<int32_t> pos(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    pos[i] = static_cast<int32_t>(entries[i].entry * r);
  }
  return pos;
}

// 1 / sqrt(index_head_dim * index_heads): the indexer's score scale.
float IndexScale(const ModelDims& d) {
  return static_cast<float>(
      std::pow(static_cast<double>(d.index_head_dim), -0.5) *
      std::pow(static_cast<double>(d.index_heads), -0.5));
}

// The indexer scores (unscaled) of queries rows [t0, t0 + n) of qi / wi
// against the first `own` entries of the cache this rank holds, into out
// [n, own]: the keys are scored where they sit in the pool. Without DCP the
// ranks' sums over their heads are added up (a collective), so `out` is the
// whole score; with DCP each rank scored its entries with every head.
absl::Status ScoreOwnedEntries(const LayerContext& ctx, KvCache& cache,
                               const std::vector<int32_t>& index_keys,
                               ConstMatrixView qi, ConstMatrixView wi,
                               int64_t t0, int64_t n, int64_t own,
                               MatrixView out) {
  if (own == 0) return absl::OkStatus();
  std::vector<int32_t> rows(own);
  for (int64_t e = 0; e < own; ++e) rows[e] = cache.Row(index_keys, e);
  ctx.backend.IndexScores(ConstMatrixView(qi.data + t0 * qi.cols, n, qi.cols),
                          ConstMatrixView(wi.data + t0 * wi.cols, n, wi.cols),
                          cache.pool(), rows, out);
  if (!ctx.dcp.enabled() && ctx.tp_size > 1) {
    RETURN_IF_ERROR(ctx.comm->AllReduceSum(out.data, n * own));
  }
  return absl::OkStatus();
}

// Under DCP, the indexer scores (unscaled) of queries rows [t0, t0 + n) of
// qi / wi (every head) against every entry [0, total) of the cache, into
// scores [n, total] on the backend of every rank: each rank scores the
// entries it owns, the scores are all-gathered and put in entry order there,
// so every rank makes the same choice from the same scores.
absl::Status ScoreDcpEntries(const LayerContext& ctx, KvCache& cache,
                             const std::vector<int32_t>& index_keys,
                             ConstMatrixView qi, ConstMatrixView wi, int64_t t0,
                             int64_t n, int64_t total, MatrixView scores) {
  gpu::Backend& backend = ctx.backend;
  Workspace& ws = ctx.workspace;
  const int ranks = ctx.dcp.size;
  const int64_t own = ctx.dcp.OwnedEntriesBefore(total);
  int64_t most = 0;
  for (int q = 0; q < ranks; ++q) {
    const DcpLayout l{
        .rank = q, .size = ranks, .interleave = ctx.dcp.interleave};
    most = std::max(most, l.OwnedEntriesBefore(total));
  }
  Workspace::Scope scope(ws);
  ASSIGN_OR_RETURN(WorkBuffer padded, ws.TakeZeroed(n * most));
  if (own > 0) {
    ASSIGN_OR_RETURN(WorkBuffer local, ws.TakeZeroed(n * own));
    RETURN_IF_ERROR(ScoreOwnedEntries(ctx, cache, index_keys, qi, wi, t0, n,
                                      own, local.view(n, own)));
    backend.PlaceColumns(local.view(n, own), padded.view(n, most), 0);
  }
  ASSIGN_OR_RETURN(WorkBuffer all, ws.Take(ranks * n * most));
  RETURN_IF_ERROR(ctx.comm->AllGather(padded.data(), n * most, all.data()));
  // [rank][query][j] -> [query][rank][j] -> [query][entry]: entry e is
  // column j of its owner's scores, j counting the owner's entries.
  std::vector<int32_t> rows(ranks * n);
  for (int64_t t = 0; t < n; ++t) {
    for (int q = 0; q < ranks; ++q) {
      rows[t * ranks + q] = static_cast<int32_t>(q * n + t);
    }
  }
  ASSIGN_OR_RETURN(WorkBuffer by_query, ws.Take(ranks * n * most));
  backend.GatherRows(all.view(ranks * n, most), rows,
                     by_query.view(n * ranks, most));
  std::vector<int32_t> columns(total);
  std::vector<int64_t> next(ranks, 0);
  for (int64_t e = 0; e < total; ++e) {
    const int owner = static_cast<int>((e / ctx.dcp.interleave) % ranks);
    columns[e] = static_cast<int32_t>(owner * most + next[owner]++);
  }
  backend.GatherColumns(by_query.view(n, ranks * most), columns, scores);
  return absl::OkStatus();
}

// The indexer's choice from scores [n, N] of n queries, query j seeing
// entries below visible[j] <= N: chosen where the scores are
// (Backend::SelectTopK), only the chosen ids come back. candidates: per
// query its V4.1 candidate blocks (empty span: none). chosen_blocks (not
// null: the V4.1 candidate source): per query the candidate blocks its
// scores choose (Backend::SelectCandidateBlocks). A query's choice does not
// depend on N (the count it may choose is capped by what it sees), so
// queries seeing fewer entries may share a wider matrix.
void ChooseOnBackend(const LayerContext& ctx, ConstMatrixView scores,
                     absl::Span<const int64_t> visible,
                     absl::Span<const std::vector<int32_t>> candidates,
                     std::vector<int32_t>* selected,
                     std::vector<int32_t>* chosen_blocks) {
  const ModelDims& d = ctx.dims;
  const int64_t n = scores.rows, total = scores.cols;
  // No row chooses more than there is (however large the configured k).
  if (chosen_blocks != nullptr) {
    const int bs = d.candidate_block_size;
    const int kb = static_cast<int>(
        std::min<int64_t>(d.candidate_topk_blocks, (total + bs - 1) / bs));
    std::vector<int32_t> ids(n * kb);
    std::vector<int32_t> counts(n);
    ctx.backend.SelectCandidateBlocks(
        scores, IndexScale(d), visible, kb, d.candidate_block_size,
        absl::MakeSpan(ids), absl::MakeSpan(counts));
    for (int64_t j = 0; j < n; ++j) {
      chosen_blocks[j].assign(ids.begin() + j * kb,
                              ids.begin() + j * kb + counts[j]);
    }
  }
  int blocks_per_row = 0;
  std::vector<int32_t> blocks;
  if (!candidates.empty()) {
    size_t most = 1;
    for (const std::vector<int32_t>& c : candidates) {
      most = std::max(most, c.size());
    }
    blocks_per_row = static_cast<int>(most);
    blocks.assign(n * most, -1);
    for (int64_t j = 0; j < n; ++j) {
      std::copy(candidates[j].begin(), candidates[j].end(),
                blocks.begin() + j * blocks_per_row);
    }
  }
  const int k = static_cast<int>(std::min<int64_t>(d.index_topk, total));
  std::vector<int32_t> ids(n * k);
  std::vector<int32_t> counts(n);
  ctx.backend.SelectTopK(scores, IndexScale(d), visible, k, blocks,
                         blocks_per_row, d.candidate_block_size,
                         absl::MakeSpan(ids), absl::MakeSpan(counts));
  for (int64_t j = 0; j < n; ++j) {
    selected[j].assign(ids.begin() + j * k, ids.begin() + j * k + counts[j]);
  }
}

// The whole indexer scores (unscaled) of queries rows [t0, t0 + out.rows)
// of qi / wi against the `out.cols` entries of the cache, on every rank:
// under DCP each rank scores the entries it owns and they are gathered
// (ScoreDcpEntries), else each rank scores every entry with its heads and
// the ranks add up (ScoreOwnedEntries).
absl::Status ScoreEntries(const LayerContext& ctx, KvCache& cache,
                          const std::vector<int32_t>& index_keys,
                          ConstMatrixView qi, ConstMatrixView wi, int64_t t0,
                          MatrixView out) {
  if (ctx.dcp.enabled()) {
    return ScoreDcpEntries(ctx, cache, index_keys, qi, wi, t0, out.rows,
                           out.cols, out);
  }
  return ScoreOwnedEntries(ctx, cache, index_keys, qi, wi, t0, out.rows,
                           out.cols, out);
}

// The indexer's choice for queries rows [t0, t0 + n) of qi / wi, query j
// seeing entries below visible[j] of `total`: scored, then chosen where the
// scores are (ChooseOnBackend).
absl::Status SelectOnBackend(const LayerContext& ctx, KvCache& cache,
                             const std::vector<int32_t>& index_keys,
                             ConstMatrixView qi, ConstMatrixView wi, int64_t t0,
                             int64_t total, absl::Span<const int64_t> visible,
                             absl::Span<const std::vector<int32_t>> candidates,
                             std::vector<int32_t>* selected,
                             std::vector<int32_t>* chosen_blocks) {
  const auto n = static_cast<int64_t>(visible.size());
  if (total == 0) {
    for (int64_t j = 0; j < n; ++j) {
      selected[j].clear();
      if (chosen_blocks != nullptr) chosen_blocks[j].clear();
    }
    return absl::OkStatus();
  }
  Workspace& ws = ctx.workspace;
  Workspace::Scope scope(ws);
  ASSIGN_OR_RETURN(WorkBuffer scores, ws.Take(n * total));
  RETURN_IF_ERROR(
      ScoreEntries(ctx, cache, index_keys, qi, wi, t0, scores.view(n, total)));
  ChooseOnBackend(ctx, scores.view(n, total), visible, candidates, selected,
                  chosen_blocks);
  return absl::OkStatus();
}

// A one-token chunk whose indexer chooses its entries (ChooseTogether), or
// one query of a chunk that attends its choice right away
// (ChooseAndAttendChunk).
struct PendingChoice {
  const std::vector<int32_t>* index_keys = nullptr;
  int64_t row = 0;  // the query's row of qi / wi
  // Its entries, every one visible to it (>= 1 in ChooseTogether; a verify
  // chunk's first queries may see none).
  int64_t total = 0;
  // Its V4.1 candidate blocks (null: none).
  const std::vector<int32_t>* candidates = nullptr;
  std::vector<int32_t>* selected = nullptr;
  // Not null at the V4.1 candidate source.
  std::vector<int32_t>* chosen_blocks = nullptr;
  // Not null when the chunk attends its choice right away
  // (ChooseAndAttendGroup; `selected` then stays empty): the blocks of the
  // entries it attends, and its window keys this rank holds (pool rows,
  // oldest first).
  const std::vector<int32_t>* entry_blocks = nullptr;
  std::vector<int32_t> window;
};

// Where the chunks that attend their choice right away put their attention
// (the rows of their queries).
struct ChosenAttention {
  const AttentionWeights* w = nullptr;
  ConstMatrixView q;  // [T, heads * head_dim]
  int64_t heads = 0;
  MatrixView o_att;  // [T, heads * head_dim]
  MatrixView lse;    // [T, heads]
};

// The indexer scores (unscaled; this rank's heads, or every head under DCP)
// of several one-token chunks' queries, each against its own entries, in
// one IndexScores call (the queries gathered first unless they are
// consecutive rows): row i of out [k, width] scores the first counts[i]
// entries of chunk i's keys this rank holds, 0 past them.
absl::Status ScoreEachOwnEntries(const LayerContext& ctx, KvCache& cache,
                                 ConstMatrixView qi, ConstMatrixView wi,
                                 absl::Span<const PendingChoice* const> chunks,
                                 absl::Span<const int64_t> counts,
                                 MatrixView out) {
  const int64_t k = out.rows, width = out.cols;
  std::vector<int32_t> rows(k * width, -1);
  std::vector<int32_t> queries(k);
  bool in_a_row = true;
  for (int64_t i = 0; i < k; ++i) {
    const PendingChoice& c = *chunks[i];
    for (int64_t e = 0; e < counts[i]; ++e) {
      rows[i * width + e] = cache.Row(*c.index_keys, e);
    }
    queries[i] = static_cast<int32_t>(c.row);
    in_a_row = in_a_row && queries[i] == queries[0] + i;
  }
  Workspace& ws = ctx.workspace;
  Workspace::Scope scope(ws);
  ConstMatrixView q = Rows(qi, queries[0], k), w = Rows(wi, queries[0], k);
  if (!in_a_row) {
    ASSIGN_OR_RETURN(WorkBuffer q_rows, ws.Take(k * qi.cols));
    ASSIGN_OR_RETURN(WorkBuffer w_rows, ws.Take(k * wi.cols));
    ctx.backend.GatherRows(qi, queries, q_rows.view(k, qi.cols));
    ctx.backend.GatherRows(wi, queries, w_rows.view(k, wi.cols));
    q = q_rows.view(k, qi.cols);
    w = w_rows.view(k, wi.cols);
  }
  ctx.backend.IndexScores(q, w, cache.pool(), rows, out);
  return absl::OkStatus();
}

// Under DCP, the indexer scores (unscaled, every head) of several one-token
// chunks' queries, each against its own entries, into out [k, width] on
// every rank (row i's entries [0, total) in entry order; the columns past
// them hold some score): each rank scores the entries it owns in one call,
// one all-gather brings every rank's, and one gather of single values puts
// them in entry order.
absl::Status ScoreEachDcpEntries(const LayerContext& ctx, KvCache& cache,
                                 ConstMatrixView qi, ConstMatrixView wi,
                                 absl::Span<const PendingChoice* const> chunks,
                                 MatrixView out) {
  const int ranks = ctx.dcp.size;
  const int64_t k = out.rows, width = out.cols;
  // Row i: this rank's entries, and the most any rank has (the gathered
  // rows' width, the same on every rank).
  std::vector<int64_t> own(k);
  int64_t most = 1;
  for (int64_t i = 0; i < k; ++i) {
    own[i] = ctx.dcp.OwnedEntriesBefore(chunks[i]->total);
    for (int q = 0; q < ranks; ++q) {
      const DcpLayout l{
          .rank = q, .size = ranks, .interleave = ctx.dcp.interleave};
      most = std::max(most, l.OwnedEntriesBefore(chunks[i]->total));
    }
  }
  Workspace& ws = ctx.workspace;
  Workspace::Scope scope(ws);
  ASSIGN_OR_RETURN(WorkBuffer local, ws.Take(k * most));
  RETURN_IF_ERROR(ScoreEachOwnEntries(ctx, cache, qi, wi, chunks, own,
                                      local.view(k, most)));
  ASSIGN_OR_RETURN(WorkBuffer all, ws.Take(ranks * k * most));
  RETURN_IF_ERROR(ctx.comm->AllGather(local.data(), k * most, all.data()));
  // [rank][row][j] -> [row][entry]: entry e of row i is column j of row i
  // of its owner's scores, j counting the owner's entries.
  std::vector<int32_t> at(k * width, 0);
  std::vector<int64_t> next(ranks);
  for (int64_t i = 0; i < k; ++i) {
    std::fill(next.begin(), next.end(), 0);
    for (int64_t e = 0; e < chunks[i]->total; ++e) {
      const int owner = static_cast<int>((e / ctx.dcp.interleave) % ranks);
      at[i * width + e] =
          static_cast<int32_t>((owner * k + i) * most + next[owner]++);
    }
  }
  ctx.backend.GatherRows(all.view(ranks * k * most, 1), at,
                         MatrixView{out.data, k * width, 1});
  return absl::OkStatus();
}

// The attention of a group of queries (one-token chunks, or a chunk's
// queries) over their window keys and the entries their scores [rows,
// width] choose, the choice never leaving the
// backend (Backend::ChooseAndAttend): the same keys PoolAttention lists.
// The chunks' keys are in the pool already (their window slots written).
absl::Status ChooseAndAttendGroup(const LayerContext& ctx, KvCache& cache,
                                  const ChosenAttention& at,
                                  absl::Span<const PendingChoice* const> chunks,
                                  ConstMatrixView scores) {
  const ModelDims& d = ctx.dims;
  const int64_t rows = scores.rows, width = scores.cols;
  const int64_t hd = d.head_dim, hq = at.heads * hd;
  size_t fixed_width = 0;
  for (const PendingChoice* c : chunks) {
    // Such chunks choose among every entry they see (no candidate blocks)
    // and nothing reads their choice later.
    if (c->entry_blocks == nullptr || c->candidates != nullptr ||
        c->chosen_blocks != nullptr) {
      return absl::InternalError(
          "a chunk that attends its choice right away has candidate blocks, "
          "or its choice is read later");
    }
    fixed_width = std::max(fixed_width, c->window.size());
  }
  std::vector<int32_t> fixed(rows * fixed_width, -1);
  std::vector<int32_t> entry_rows(rows * width, -1);
  std::vector<int64_t> visible(rows);
  std::vector<int32_t> queries(rows);
  bool in_a_row = true;
  for (int64_t i = 0; i < rows; ++i) {
    const PendingChoice& c = *chunks[i];
    std::copy(c.window.begin(), c.window.end(),
              fixed.begin() + i * static_cast<int64_t>(fixed_width));
    for (int64_t e = 0; e < c.total; ++e) {
      if (ctx.dcp.OwnsEntry(e)) {
        entry_rows[i * width + e] =
            cache.Row(*c.entry_blocks, ctx.dcp.OwnedEntriesBefore(e));
      }
    }
    visible[i] = c.total;
    queries[i] = static_cast<int32_t>(c.row);
    in_a_row = in_a_row && queries[i] == queries[0] + i;
  }
  gpu::Backend& backend = ctx.backend;
  Workspace& ws = ctx.workspace;
  Workspace::Scope scope(ws);
  ConstMatrixView q = Rows(at.q, queries[0], rows);
  MatrixView out = Rows(at.o_att, queries[0], rows);
  MatrixView lse = Rows(at.lse, queries[0], rows);
  WorkBuffer q_rows, out_rows, lse_rows;
  if (!in_a_row) {
    ASSIGN_OR_RETURN(q_rows, ws.Take(rows * hq));
    ASSIGN_OR_RETURN(out_rows, ws.Take(rows * hq));
    ASSIGN_OR_RETURN(lse_rows, ws.Take(rows * at.heads));
    backend.GatherRows(at.q, queries, q_rows.view(rows, hq));
    q = q_rows.view(rows, hq);
    out = out_rows.view(rows, hq);
    lse = lse_rows.view(rows, at.heads);
  }
  backend.ChooseAndAttend(
      scores, IndexScale(d), visible,
      static_cast<int>(std::min<int64_t>(d.index_topk, width)), entry_rows, q,
      cache.pool(), static_cast<int>(at.heads), fixed,
      static_cast<int>(fixed_width), 1.0f / std::sqrt(static_cast<float>(hd)),
      ctx.dcp.enabled() ? nullptr : at.w->attn_sink->data(), out, lse);
  if (!in_a_row) {
    backend.ScatterRows(out, queries, at.o_att);
    backend.ScatterRows(lse, queries, at.lse);
  }
  return absl::OkStatus();
}

// The choices of several one-token chunks (a decode step's sequences) made
// together: each chunk's scores are a row of one matrix as wide as the most
// entries any of them has, and one SelectTopK (one wait for the ids; none
// where the chunks attend their choice right away) chooses for every row
// instead of one per chunk. One IndexScores call scores every
// row against its own entries; without DCP the ranks add up the whole
// matrix in one all-reduce, under DCP one all-gather brings every rank's
// entries' scores (ScoreEachDcpEntries). A row's columns past its entries
// are never read (the choice looks only below each row's visible count).
// Chunks with and without candidate blocks go in separate groups, in order
// of their entries, grouped by ChoiceGroupEnds (at most kMaxScoreFloats
// scores a group, one long context among short ones chosen alone, not
// padded into every row); within a group the rows go in step order, so a
// decode step's queries are usually consecutive rows, read in place.
// Chunks with entry_blocks attend their choice right away
// (ChooseAndAttendGroup, into `attend`), the others' choices come back.
// Every rank calls it with the same chunks, so the collectives stay in
// step.
absl::Status ChooseTogether(const LayerContext& ctx, KvCache& cache,
                            ConstMatrixView qi, ConstMatrixView wi,
                            absl::Span<const PendingChoice> all,
                            const ChosenAttention& attend) {
  Workspace& ws = ctx.workspace;
  for (const bool with_candidates : {false, true}) {
    std::vector<const PendingChoice*> these;
    for (const PendingChoice& c : all) {
      if ((c.candidates != nullptr) == with_candidates) these.push_back(&c);
    }
    std::stable_sort(these.begin(), these.end(),
                     [](const PendingChoice* a, const PendingChoice* b) {
                       return a->total < b->total;
                     });
    std::vector<int64_t> totals;
    totals.reserve(these.size());
    for (const PendingChoice* c : these) totals.push_back(c->total);
    size_t begin = 0;
    for (const size_t end : ChoiceGroupEnds(totals, kMaxScoreFloats)) {
      // The group's widest row is its last (ascending totals); then its rows
      // in step order.
      const int64_t width = these[end - 1]->total;
      const auto rows = static_cast<int64_t>(end - begin);
      std::sort(these.begin() + static_cast<int64_t>(begin),
                these.begin() + static_cast<int64_t>(end),
                [](const PendingChoice* a, const PendingChoice* b) {
                  return a->row < b->row;
                });
      Workspace::Scope scope(ws);
      ASSIGN_OR_RETURN(WorkBuffer scores, ws.Take(rows * width));
      const absl::Span<const PendingChoice* const> group =
          absl::MakeConstSpan(these).subspan(begin, rows);
      std::vector<int64_t> visible(rows);
      std::vector<std::vector<int32_t>> candidates;
      for (int64_t i = 0; i < rows; ++i) {
        const PendingChoice& c = *group[i];
        visible[i] = c.total;
        if (with_candidates) candidates.push_back(*c.candidates);
      }
      if (ctx.dcp.enabled()) {
        RETURN_IF_ERROR(ScoreEachDcpEntries(ctx, cache, qi, wi, group,
                                            scores.view(rows, width)));
      } else {
        RETURN_IF_ERROR(ScoreEachOwnEntries(ctx, cache, qi, wi, group, visible,
                                            scores.view(rows, width)));
        if (ctx.tp_size > 1) {
          RETURN_IF_ERROR(ctx.comm->AllReduceSum(scores.data(), rows * width));
        }
      }
      if (these[begin]->entry_blocks != nullptr) {
        RETURN_IF_ERROR(ChooseAndAttendGroup(ctx, cache, attend, group,
                                             scores.view(rows, width)));
        begin = end;
        continue;
      }
      const bool source = these[begin]->chosen_blocks != nullptr;
      std::vector<std::vector<int32_t>> selected(rows), chosen(rows);
      ChooseOnBackend(ctx, scores.view(rows, width), visible, candidates,
                      selected.data(), source ? chosen.data() : nullptr);
      for (int64_t i = 0; i < rows; ++i) {
        const PendingChoice& c = *these[begin + i];
        *c.selected = std::move(selected[i]);
        if (c.chosen_blocks != nullptr) *c.chosen_blocks = std::move(chosen[i]);
      }
      begin = end;
    }
  }
  return absl::OkStatus();
}

// Attention of one chunk's queries (rows [t0, t0 + n) of q) over the
// window positions this rank attends and the selected entries it owns.
// Then remembers the chunk's last window tokens in the ring.
absl::Status ChunkAttention(const LayerContext& ctx, const AttentionWeights& w,
                            KvCache& cache, SequenceState::LayerState& ls,
                            const std::vector<int32_t>* entry_blocks,
                            const std::vector<std::vector<int32_t>>& selected,
                            int64_t t0, int64_t p0, int64_t n, MatrixView q,
                            int64_t heads, MatrixView kv, MatrixView o_att,
                            MatrixView lse) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int64_t hd = d.head_dim;
  const int W = d.sliding_window;
  const int64_t ring = ctx.WindowRing();
  const bool dcp = ctx.dcp.enabled();
  const MatrixView pool = cache.pool();
  Workspace::Scope scope(ctx.workspace);
  // Key rows: earlier window positions (ring), this chunk's tokens, then
  // the selected entries this rank owns.
  const ChunkKeys keys_of = ListChunkKeys(ctx.dcp, W, p0, n, selected);
  std::vector<int32_t> rows;
  rows.reserve(std::max(keys_of.earlier.size(), keys_of.entries.size()));
  const auto n_prev = static_cast<int64_t>(keys_of.earlier.size());
  const auto n_own = static_cast<int64_t>(keys_of.own.size());
  const auto n_entries = static_cast<int64_t>(keys_of.entries.size());
  const int64_t K = keys_of.keys();
  ASSIGN_OR_RETURN(WorkBuffer keys,
                   ctx.workspace.Take(std::max<int64_t>(K, 1) * hd));
  const MatrixView keys_view = keys.view(K, hd);
  if (n_prev > 0) {
    for (const int64_t p : keys_of.earlier) {
      rows.push_back(cache.Row(ls.window, p % ring));
    }
    backend.GatherRows(pool, rows, Rows(keys_view, 0, n_prev));
  }
  if (n_own > 0) {
    rows.clear();
    for (const int32_t j : keys_of.own) {
      rows.push_back(static_cast<int32_t>(t0 + j));
    }
    backend.GatherRows(kv, rows, Rows(keys_view, n_prev, n_own));
  }
  if (n_entries > 0) {
    rows.clear();
    for (const int32_t e : keys_of.entries) {
      rows.push_back(cache.Row(*entry_blocks, ctx.dcp.OwnedEntriesBefore(e)));
    }
    backend.GatherRows(pool, rows, Rows(keys_view, n_prev + n_own, n_entries));
  }
  const std::vector<int32_t>& idx = keys_of.idx;
  const int width = keys_of.width;
  backend.SparseAttention(Rows(q, t0, n), keys_view, static_cast<int>(heads),
                          idx, width, 1.0f / std::sqrt(static_cast<float>(hd)),
                          dcp ? nullptr : w.attn_sink->data(),
                          Rows(o_att, t0, n), Rows(lse, t0, n));
  // Remember the last `ring` tokens of the chunk (contiguous rows of kv) in
  // the window ring.
  const int64_t first_kept = std::max(p0, p0 + n - ring);
  std::vector<int32_t> dst_rows;
  for (int64_t p = first_kept; p < p0 + n; ++p) {
    dst_rows.push_back(cache.Row(ls.window, p % ring));
  }
  backend.ScatterRows(
      Rows(kv, t0 + first_kept - p0, static_cast<int64_t>(dst_rows.size())),
      dst_rows, pool);
  return absl::OkStatus();
}

// Whether a chunk of n tokens attends its keys where they are in the pool
// (PoolAttention) instead of a gathered copy (ChunkAttention). Its keys go
// into the window ring first, so they must not overwrite a position one of
// its own queries attends: the chunk's last token takes the slot of
// position p0 + n - 1 - ring, and its first query attends from p0 - W + 1.
// The ring keeps rollback_tokens positions more than the window, so decode
// steps (n = 1) and speculative verify steps (n <= rollback_tokens + 1)
// qualify; prefill chunks do not.
bool AttendsInPlace(const LayerContext& ctx, int64_t n) {
  return n >= 1 && n - 1 + ctx.dims.sliding_window <= ctx.WindowRing();
}

// Consecutive chunks (query rows [t0, t0 + lists.size())) that attend in
// place, attended in one backend call.
struct PoolAttention {
  int64_t t0 = 0;
  // The window ring slots of the run's tokens, in row order.
  std::vector<int32_t> ring_rows;
  // Per query row: the pool rows it attends, in the order ChunkAttention
  // lists them (window positions oldest first, then the selected entries).
  std::vector<std::vector<int32_t>> lists;

  // Adds the chunk of rows [t0, t0 + n) at positions [p0, p0 + n): the same
  // keys ChunkAttention gathers (those this rank owns under DCP), as pool
  // rows.
  void Add(const LayerContext& ctx, const KvCache& cache,
           const SequenceState::LayerState& ls,
           const std::vector<int32_t>* entry_blocks,
           const std::vector<std::vector<int32_t>>& selected, int64_t t0_chunk,
           int64_t p0, int64_t n) {
    if (lists.empty()) t0 = t0_chunk;
    const int64_t ring = ctx.WindowRing();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = p0 + j;
      ring_rows.push_back(cache.Row(ls.window, p % ring));
      std::vector<int32_t>& keys = lists.emplace_back();
      const absl::Span<const int32_t> sel =
          j < static_cast<int64_t>(selected.size())
              ? absl::MakeConstSpan(selected[j])
              : absl::Span<const int32_t>();
      ForEachKeyOfQuery(
          ctx.dcp, ctx.dims.sliding_window, p, sel,
          [&](int64_t q) { keys.push_back(cache.Row(ls.window, q % ring)); },
          [&](int32_t e) {
            keys.push_back(
                cache.Row(*entry_blocks, ctx.dcp.OwnedEntriesBefore(e)));
          });
    }
  }

  // Writes the run's keys into their ring slots, then attends every query
  // of the run over the pool in one call; empties the run.
  void Run(const LayerContext& ctx, const AttentionWeights& w, KvCache& cache,
           MatrixView q, int64_t heads, MatrixView kv, MatrixView o_att,
           MatrixView lse) {
    if (lists.empty()) return;
    const int64_t rows = static_cast<int64_t>(lists.size());
    const int64_t hd = ctx.dims.head_dim;
    const MatrixView pool = cache.pool();
    ctx.backend.ScatterRows(Rows(kv, t0, rows), ring_rows, pool);
    // At least 1: under DCP a rank may own none of the run's keys.
    size_t width = 1;
    for (const std::vector<int32_t>& keys : lists) {
      width = std::max(width, keys.size());
    }
    std::vector<int32_t> idx(rows * width, -1);
    for (int64_t j = 0; j < rows; ++j) {
      std::copy(lists[j].begin(), lists[j].end(), idx.begin() + j * width);
    }
    ctx.backend.SparseAttention(
        Rows(q, t0, rows), pool, static_cast<int>(heads), idx,
        static_cast<int>(width), 1.0f / std::sqrt(static_cast<float>(hd)),
        ctx.dcp.enabled() ? nullptr : w.attn_sink->data(),
        Rows(o_att, t0, rows), Rows(lse, t0, rows));
    ring_rows.clear();
    lists.clear();
  }
};

// The window keys this rank holds of a query at position p (pool rows,
// oldest first; ForEachKeyOfQuery's).
std::vector<int32_t> WindowRows(const LayerContext& ctx, const KvCache& cache,
                                const SequenceState::LayerState& ls,
                                int64_t p) {
  const int64_t ring = ctx.WindowRing();
  std::vector<int32_t> rows;
  ForEachKeyOfQuery(
      ctx.dcp, ctx.dims.sliding_window, p, {},
      [&](int64_t q) { rows.push_back(cache.Row(ls.window, q % ring)); },
      [](int32_t) {});
  return rows;
}

// The indexer's choice and the attention of a chunk of n tokens (rows
// [t0, t0 + n) of the step, positions [p0, p0 + n), (p0 + n) / r >= 1
// entries) that attends in place, the choice never leaving the backend: a block
// of its queries at a time (bounded workspace however long the context; every
// rank blocks the same way, so the collectives inside stay in step) scored
// against every entry, then ChooseAndAttendGroup with a row per query, each
// seeing its own entries and window. Its keys are in their window slots
// already.
absl::Status ChooseAndAttendChunk(const LayerContext& ctx, KvCache& cache,
                                  const ChosenAttention& at,
                                  const std::vector<int32_t>& index_keys,
                                  ConstMatrixView qi, ConstMatrixView wi,
                                  const SequenceState::LayerState& ls,
                                  const std::vector<int32_t>& entry_blocks,
                                  int r, int64_t t0, int64_t p0, int64_t n) {
  const int64_t total = (p0 + n) / r;
  const int64_t block =
      std::max<int64_t>(1, std::min<int64_t>(n, kMaxScoreFloats / total));
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t nb = std::min(block, n - j0);
    std::vector<PendingChoice> queries(nb);
    std::vector<const PendingChoice*> group(nb);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t p = p0 + j0 + j;
      PendingChoice& c = queries[j];
      c.index_keys = &index_keys;
      c.row = t0 + j0 + j;
      c.total = (p + 1) / r;
      c.entry_blocks = &entry_blocks;
      c.window = WindowRows(ctx, cache, ls, p);
      group[j] = &c;
    }
    Workspace::Scope scope(ctx.workspace);
    ASSIGN_OR_RETURN(WorkBuffer scores, ctx.workspace.Take(nb * total));
    RETURN_IF_ERROR(ScoreEntries(ctx, cache, index_keys, qi, wi, t0 + j0,
                                 scores.view(nb, total)));
    RETURN_IF_ERROR(
        ChooseAndAttendGroup(ctx, cache, at, group, scores.view(nb, total)));
  }
  return absl::OkStatus();
}

// Writes the keys of every chunk marked in `which` (a chunk of the step
// each) into their window ring slots, in one call: kv [T, hd] holds the
// step's keys, a chunk's at its rows.
absl::Status WriteWindowKeys(const LayerContext& ctx, KvCache& cache,
                             const StepBatch& batch, int layer,
                             const std::vector<bool>& which, MatrixView kv) {
  const int64_t ring = ctx.WindowRing();
  std::vector<int32_t> rows, slots;
  int64_t row = 0;
  for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
    const SequenceChunk& c = batch.input.chunks[ci];
    const auto n = static_cast<int64_t>(c.tokens.size());
    for (int64_t j = 0; which[ci] && j < n; ++j) {
      rows.push_back(static_cast<int32_t>(row + j));
      slots.push_back(cache.Row(batch.seqs[ci]->layers[layer].window,
                                (c.start_position + j) % ring));
    }
    row += n;
  }
  if (rows.empty()) return absl::OkStatus();
  const auto n = static_cast<int64_t>(rows.size());
  if (rows.back() - rows.front() + 1 == n) {
    ctx.backend.ScatterRows(Rows(kv, rows.front(), n), slots, cache.pool());
    return absl::OkStatus();
  }
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer keys, ctx.workspace.Take(n * kv.cols));
  ctx.backend.GatherRows(kv, rows, keys.view(n, kv.cols));
  ctx.backend.ScatterRows(keys.view(n, kv.cols), slots, cache.pool());
  return absl::OkStatus();
}

}  // namespace

absl::Status AttentionForward(const LayerContext& ctx,
                              const AttentionWeights& w, int layer,
                              KvCache& cache, const StepBatch& batch,
                              StepSelections& shared, ConstMatrixView xn,
                              MatrixView out) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  Workspace& ws = ctx.workspace;
  const int64_t T = xn.rows, hd = d.head_dim, ql = d.q_lora_rank;
  const int64_t hl = d.num_heads / ctx.tp_size;
  const int r = d.compress_ratios[layer];
  const bool v41 = d.IsV41();
  const auto fwd = gpu::Backend::RopeDirection::kForward;
  const std::vector<int32_t>& positions = batch.positions;
  const bool dcp = ctx.dcp.enabled();
  Workspace::Scope scope(ws);
  if (shared.chunks.size() != batch.input.chunks.size()) {
    shared.chunks.assign(batch.input.chunks.size(), {});
  }

  ASSIGN_OR_RETURN(WorkBuffer qa, ws.Take(T * ql));
  ASSIGN_OR_RETURN(WorkBuffer q, ws.Take(T * hl * hd));
  ASSIGN_OR_RETURN(WorkBuffer kv, ws.Take(T * hd));
  ProjectQueryKv(ctx, w, xn, positions, qa.view(T, ql), q.view(T, hl * hd),
                 kv.view(T, hd));

  // The compressor's projections.
  WorkBuffer ckv, cscore, ikv, iscore;
  const CompressorWeights* comp = w.compressor.get();
  const CompressorWeights* icomp =
      w.indexer != nullptr ? w.indexer->compressor.get() : nullptr;
  if (comp != nullptr) {
    ASSIGN_OR_RETURN(ckv, ws.Take(T * comp->width()));
    ASSIGN_OR_RETURN(cscore, ws.Take(T * comp->width()));
    RETURN_IF_ERROR(CompressorProject(ctx, *comp, xn, positions,
                                      ckv.view(T, comp->width()),
                                      cscore.view(T, comp->width())));
  }
  if (icomp != nullptr) {
    ASSIGN_OR_RETURN(ikv, ws.Take(T * icomp->width()));
    ASSIGN_OR_RETURN(iscore, ws.Take(T * icomp->width()));
    RETURN_IF_ERROR(CompressorProject(ctx, *icomp, xn, positions,
                                      ikv.view(T, icomp->width()),
                                      iscore.view(T, icomp->width())));
  }
  // The indexer's queries and head weights (every head under DCP).
  WorkBuffer qi, wi;
  const int64_t dI = d.index_head_dim;
  if (w.indexer != nullptr) {
    const int64_t hlI = d.index_heads / ctx.tp_size;
    ASSIGN_OR_RETURN(WorkBuffer qi_local, ws.Take(T * hlI * dI));
    ASSIGN_OR_RETURN(WorkBuffer wi_local, ws.Take(T * hlI));
    backend.Linear(qa.view(T, ql), *w.indexer->wq_b,
                   qi_local.view(T, hlI * dI));
    backend.Rope(qi_local.view(T, hlI * dI), static_cast<int>(dI), d.rope_dim,
                 w.rope, positions, fwd);
    backend.Linear(xn, *w.indexer->weights_proj, wi_local.view(T, hlI));
    if (dcp) {
      ASSIGN_OR_RETURN(qi, ws.Take(T * d.index_heads * dI));
      ASSIGN_OR_RETURN(wi, ws.Take(T * d.index_heads));
      RETURN_IF_ERROR(GatherHeads(ctx, qi_local.view(T, hlI * dI),
                                  qi.view(T, d.index_heads * dI)));
      RETURN_IF_ERROR(
          GatherHeads(ctx, wi_local.view(T, hlI), wi.view(T, d.index_heads)));
    } else {
      qi = qi_local;
      wi = wi_local;
    }
  }
  const int64_t hI = dcp ? d.index_heads : d.index_heads / ctx.tp_size;

  // With DCP every rank attends with all heads over the entries it owns and
  // the partial results are merged across ranks; otherwise each rank
  // attends with its own heads over every entry.
  const int64_t heads = dcp ? d.num_heads : hl;
  MatrixView qv = q.view(T, hl * hd);
  WorkBuffer q_all;
  if (dcp) {
    ASSIGN_OR_RETURN(q_all, ws.Take(T * d.num_heads * hd));
    RETURN_IF_ERROR(
        GatherHeads(ctx, q.view(T, hl * hd), q_all.view(T, d.num_heads * hd)));
    qv = q_all.view(T, heads * hd);
  }
  ASSIGN_OR_RETURN(WorkBuffer o_att, ws.Take(T * heads * hd));
  ASSIGN_OR_RETURN(WorkBuffer lse, ws.Take(T * heads));

  const int src = d.CacheSource(layer);
  // First every chunk's compressors and which entries its queries attend
  // (one-token chunks' indexer choices made together after the others; V4's
  // chunks that attend in place attended with their choice there); then the
  // attention of the others, where decode-size chunks attend where their keys
  // are, together (see AttendsInPlace), a chunk that does not ending the run
  // before it.
  std::vector<std::vector<std::vector<int32_t>>> selections(
      batch.input.chunks.size());
  std::vector<PendingChoice> pending;
  PoolAttention in_place;
  // V4's chunks that attend in place (decode and speculative verify steps)
  // attend the entries their indexer chooses right away, the choice never
  // coming back to the host (V4.1's layers after an index source reuse its
  // choice, so it comes back there); their keys go into their window slots
  // first.
  std::vector<bool> attended(batch.input.chunks.size(), false);
  if (!v41 && r > 0 && w.indexer != nullptr) {
    for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
      const SequenceChunk& c = batch.input.chunks[ci];
      const auto n = static_cast<int64_t>(c.tokens.size());
      attended[ci] = AttendsInPlace(ctx, n) && (c.start_position + n) / r > 0;
    }
  }
  const ChosenAttention attention{.w = &w,
                                  .q = qv,
                                  .heads = heads,
                                  .o_att = o_att.view(T, heads * hd),
                                  .lse = lse.view(T, heads)};
  // Every chunk's compressors together (their entries pooled in a few
  // calls), before any chunk's indexer reads the entries they complete.
  const auto owned = [&](int64_t e) { return ctx.dcp.OwnsEntry(e); };
  const auto layer_state = [&](int32_t chunk) -> SequenceState::LayerState& {
    return batch.seqs[chunk]->layers[layer];
  };
  const auto entry_blocks_of =
      [&](int32_t chunk) -> const std::vector<int32_t>& {
    return layer_state(chunk).entries;
  };
  const auto index_blocks_of =
      [&](int32_t chunk) -> const std::vector<int32_t>& {
    return layer_state(chunk).index_keys;
  };
  // Adds every chunk to `step`, each with its sequence's `state`.
  const auto add_chunks =
      [&](CompressorStep& step,
          std::vector<int32_t> SequenceState::LayerState::*state) {
        int64_t t0 = 0;
        for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
          const SequenceChunk& c = batch.input.chunks[ci];
          const auto n = static_cast<int64_t>(c.tokens.size());
          const auto chunk = static_cast<int32_t>(ci);
          step.Add(chunk, layer_state(chunk).*state, t0, c.start_position, n,
                   owned);
          t0 += n;
        }
      };
  if (comp != nullptr) {
    CompressorStep step(ctx, *comp, cache, ckv.view(T, comp->width()),
                        cscore.view(T, comp->width()));
    add_chunks(step, &SequenceState::LayerState::state);
    const bool keys_here = v41 && w.index_wk != nullptr;
    RETURN_IF_ERROR(step.Finish([&](absl::Span<const CompletedEntry> entries,
                                    MatrixView e) -> absl::Status {
      const int64_t count = e.rows;
      const std::vector<int32_t> at = EntryPositions(entries, r);
      if (keys_here) {
        // V4.1 index keys: k_norm(wk(entry before RoPE)), rotated.
        Workspace::Scope keys_scope(ws);
        ASSIGN_OR_RETURN(WorkBuffer k, ws.Take(count * dI));
        backend.Linear(e, *w.index_wk, k.view(count, dI));
        backend.RmsNorm(k.view(count, dI), w.index_k_norm->data(),
                        d.rms_norm_eps, k.view(count, dI));
        backend.Rope(k.view(count, dI), static_cast<int>(dI), d.rope_dim,
                     w.rope, at, fwd);
        RETURN_IF_ERROR(StoreEntries(ctx, cache, index_blocks_of, entries,
                                     k.view(count, dI)));
      }
      backend.Rope(e, static_cast<int>(hd), d.rope_dim, w.rope, at, fwd);
      return StoreEntries(ctx, cache, entry_blocks_of, entries, e);
    }));
  }
  if (icomp != nullptr) {
    CompressorStep step(ctx, *icomp, cache, ikv.view(T, icomp->width()),
                        iscore.view(T, icomp->width()));
    add_chunks(step, &SequenceState::LayerState::index_state);
    RETURN_IF_ERROR(step.Finish([&](absl::Span<const CompletedEntry> entries,
                                    MatrixView e) -> absl::Status {
      backend.Rope(e, static_cast<int>(dI), d.rope_dim, w.rope,
                   EntryPositions(entries, r), fwd);
      return StoreEntries(ctx, cache, index_blocks_of, entries, e);
    }));
  }
  RETURN_IF_ERROR(
      WriteWindowKeys(ctx, cache, batch, layer, attended, kv.view(T, hd)));
  int64_t t0 = 0;
  for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
    const SequenceChunk& c = batch.input.chunks[ci];
    SequenceState& seq = *batch.seqs[ci];
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    const int64_t p0 = c.start_position;
    // Which entries each query attends.
    std::vector<std::vector<int32_t>>& selected = selections[ci];
    StepSelections::Chunk& sc = shared.chunks[ci];
    if (r > 0) {
      const int64_t total = (p0 + n) / r;
      if (w.indexer != nullptr) {
        const std::vector<int32_t>& key_blocks =
            seq.layers[v41 ? src : layer].index_keys;
        const bool is_candidate_source =
            v41 && layer == d.candidate_source_layer;
        const bool uses_candidates = v41 && d.candidate_source_layer >= 0 &&
                                     d.candidate_source_layer < layer;
        if (is_candidate_source) sc.candidate_blocks.assign(n, {});
        selected.resize(n);
        // The scores stay on the backend (under DCP too, gathered there):
        // only the choice comes back.
        const bool with_candidates = uses_candidates && sc.has_candidates;
        if (n == 1 && total > 0) {
          PendingChoice& choice = pending.emplace_back(PendingChoice{
              .index_keys = &key_blocks,
              .row = t0,
              .total = total,
              .candidates =
                  with_candidates ? sc.candidate_blocks.data() : nullptr,
              .selected = selected.data(),
              .chosen_blocks =
                  is_candidate_source ? sc.candidate_blocks.data() : nullptr,
              .entry_blocks = nullptr,
              .window = {}});
          if (attended[ci]) {
            choice.entry_blocks = &seq.layers[src].entries;
            choice.window = WindowRows(ctx, cache, seq.layers[layer], p0);
          }
        } else if (attended[ci]) {
          RETURN_IF_ERROR(ChooseAndAttendChunk(
              ctx, cache, attention, key_blocks, qi.view(T, hI * dI),
              wi.view(T, hI), seq.layers[layer], seq.layers[src].entries, r, t0,
              p0, n));
        } else {
          // The scores of a block of queries at a time: bounded workspace
          // however long the context (every rank blocks the same way, so
          // the collectives inside stay in step).
          const int64_t block = std::max<int64_t>(
              1, std::min<int64_t>(
                     n, kMaxScoreFloats / std::max<int64_t>(total, 1)));
          std::vector<int64_t> visible;
          for (int64_t j0 = 0; j0 < n; j0 += block) {
            const int64_t nb = std::min(block, n - j0);
            visible.resize(nb);
            for (int64_t j = 0; j < nb; ++j) {
              visible[j] = (p0 + j0 + j + 1) / r;
            }
            RETURN_IF_ERROR(SelectOnBackend(
                ctx, cache, key_blocks, qi.view(T, hI * dI), wi.view(T, hI),
                t0 + j0, total, visible,
                with_candidates
                    ? absl::MakeConstSpan(sc.candidate_blocks).subspan(j0, nb)
                    : absl::Span<const std::vector<int32_t>>(),
                selected.data() + j0,
                is_candidate_source ? sc.candidate_blocks.data() + j0
                                    : nullptr));
          }
        }
        if (is_candidate_source) sc.has_candidates = true;
        sc.has_selection = true;
      } else if (v41) {
        if (!sc.has_selection) {
          return absl::InternalError(absl::StrCat(
              "layer ", layer, " reuses a selection no index source made"));
        }
        selected = sc.selected;
      } else {
        // V4 without an indexer: every visible entry.
        selected.resize(n);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t visible = (p0 + j + 1) / r;
          selected[j].resize(visible);
          std::iota(selected[j].begin(), selected[j].end(), 0);
        }
      }
    }
    t0 += n;
  }
  // The one-token chunks' choices, made together (and attended, where they
  // attend in place); then what every chunk's indexer chose is what the
  // layers reusing it attend.
  RETURN_IF_ERROR(ChooseTogether(ctx, cache, qi.view(T, hI * dI),
                                 wi.view(T, hI), pending, attention));
  if (r > 0 && w.indexer != nullptr) {
    for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
      shared.chunks[ci].selected = selections[ci];
    }
  }
  // Attention, chunk by chunk (rows [row, row + n) of the step).
  int64_t row = 0;
  for (size_t ci = 0; ci < batch.input.chunks.size(); ++ci) {
    std::vector<SequenceState::LayerState>& layers = batch.seqs[ci]->layers;
    const auto n = static_cast<int64_t>(batch.input.chunks[ci].tokens.size());
    const int64_t p0 = batch.input.chunks[ci].start_position;
    const std::vector<int32_t>* entry_blocks =
        r > 0 ? &layers[src].entries : nullptr;
    if (attended[ci]) {
      // Attended with its choice (ChooseTogether or ChooseAndAttendChunk).
      in_place.Run(ctx, w, cache, qv, heads, kv.view(T, hd),
                   o_att.view(T, heads * hd), lse.view(T, heads));
    } else if (AttendsInPlace(ctx, n)) {
      in_place.Add(ctx, cache, layers[layer], entry_blocks, selections[ci], row,
                   p0, n);
    } else {
      in_place.Run(ctx, w, cache, qv, heads, kv.view(T, hd),
                   o_att.view(T, heads * hd), lse.view(T, heads));
      RETURN_IF_ERROR(ChunkAttention(ctx, w, cache, layers[layer], entry_blocks,
                                     selections[ci], row, p0, n, qv, heads,
                                     kv.view(T, hd), o_att.view(T, heads * hd),
                                     lse.view(T, heads)));
    }
    row += n;
  }
  in_place.Run(ctx, w, cache, qv, heads, kv.view(T, hd),
               o_att.view(T, heads * hd), lse.view(T, heads));
  MatrixView o = o_att.view(T, hl * hd);
  WorkBuffer mine;
  if (dcp) {
    ASSIGN_OR_RETURN(mine, ws.Take(T * hl * hd));
    RETURN_IF_ERROR(MergeAttention(
        backend, *ctx.comm, ws, o_att.view(T, heads * hd), lse.view(T, heads),
        w.attn_sink->data(), mine.view(T, hl * hd)));
    o = mine.view(T, hl * hd);
  }
  backend.Rope(o, static_cast<int>(hd), d.rope_dim, w.rope, positions,
               gpu::Backend::RopeDirection::kInverse);
  RETURN_IF_ERROR(OutputProjection(ctx, w, o, out));
  return ctx.AllReduce(out);
}

void ProjectQueryKv(const LayerContext& ctx, const AttentionWeights& w,
                    ConstMatrixView xn, absl::Span<const int32_t> positions,
                    MatrixView qa, MatrixView q, MatrixView kv) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int64_t T = xn.rows, hd = d.head_dim;
  const auto fwd = gpu::Backend::RopeDirection::kForward;
  backend.Linear(xn, *w.wq_a, qa);
  backend.RmsNorm(qa, w.q_norm->data(), d.rms_norm_eps, qa);
  backend.Linear(qa, *w.wq_b, q);
  if (!d.IsV41()) {
    // V4 re-normalises every query head (no weight).
    const MatrixView heads{q.data, T * (q.cols / hd), hd};
    backend.RmsNorm(heads, nullptr, d.rms_norm_eps, heads);
  }
  backend.Rope(q, static_cast<int>(hd), d.rope_dim, w.rope, positions, fwd);
  backend.Linear(xn, *w.wkv, kv);
  backend.RmsNorm(kv, w.kv_norm->data(), d.rms_norm_eps, kv);
  backend.Rope(kv, static_cast<int>(hd), d.rope_dim, w.rope, positions, fwd);
}

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

}  // namespace mneme::model
