#include "model/layers/embedding_head.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "gpu/backend.h"

namespace mneme::model {

absl::StatusOr<VocabShard> ShardVocabulary(int64_t vocab_size, int tp_rank,
                                           int tp_size) {
  VocabShard v;
  v.shard = CeilDiv(vocab_size, tp_size);
  v.begin = std::min<int64_t>(tp_rank * v.shard, vocab_size);
  v.rows = std::min(v.shard, vocab_size - v.begin);
  if (v.rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", tp_size, " leaves rank ", tp_rank,
                     " no rows of the ", vocab_size, "-token vocabulary"));
  }
  return v;
}

absl::StatusOr<EmbeddingHeadWeights> LoadEmbeddingHeadWeights(
    WeightLoader& load, const ModelDims& dims, const VocabShard& vocab) {
  const int64_t D = dims.hidden_size;
  const Slice rows{vocab.begin, vocab.rows};
  EmbeddingHeadWeights w;
  ASSIGN_OR_RETURN(w.embed, load.Linear("embed", dims.vocab_size, D, rows));
  ASSIGN_OR_RETURN(w.head, load.Linear("head", dims.vocab_size, D, rows));
  ASSIGN_OR_RETURN(w.norm, load.Vector("norm.weight", {D}));
  if (!dims.IsV41()) {
    ASSIGN_OR_RETURN(w.hc_head, LoadHcHeadWeights(load, dims));
  } else if (load.Has("hc_head_fn")) {
    return absl::InvalidArgumentError(
        "hc_head_fn: DeepSeek-V4.1 has no head hyper-connection (a V4 "
        "checkpoint with model_type deepseek_v41?)");
  }
  return w;
}

absl::Status Embed(const LayerContext& ctx, const EmbeddingHeadWeights& w,
                   const VocabShard& vocab, absl::Span<const int32_t> ids,
                   gpu::MatrixView stream) {
  const int64_t T = static_cast<int64_t>(ids.size());
  const int64_t D = ctx.dims.hidden_size, hc = ctx.dims.hc_mult;
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer emb, ctx.workspace.Take(T * D));
  ctx.backend.Embedding(ids, vocab.begin, *w.embed, emb.view(T, D));
  RETURN_IF_ERROR(ctx.AllReduce(emb.view(T, D)));
  std::vector<int32_t> rep(T * hc);
  for (int64_t i = 0; i < T * hc; ++i) rep[i] = static_cast<int32_t>(i / hc);
  ctx.backend.GatherRows(emb.view(T, D), rep,
                         gpu::MatrixView{stream.data, T * hc, D});
  return absl::OkStatus();
}

absl::Status VocabLogitsOnBackend(const LayerContext& ctx,
                                  const gpu::Weight& head,
                                  const VocabShard& vocab,
                                  gpu::ConstMatrixView x,
                                  gpu::MatrixView logits) {
  gpu::Backend& backend = ctx.backend;
  const int64_t R = x.rows, V = ctx.dims.vocab_size;
  const int n = ctx.tp_size;
  if (n == 1) {
    backend.Linear(x, head, logits);
    return absl::OkStatus();
  }
  // Each rank's shard padded to vocab.shard columns, gathered, and put in
  // place where it is.
  const int64_t vs = vocab.shard;
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer local, ctx.workspace.Take(R * vocab.rows));
  backend.Linear(x, head, local.view(R, vocab.rows));
  ASSIGN_OR_RETURN(WorkBuffer send, ctx.workspace.Take(R * vs));
  backend.PlaceColumns(local.view(R, vocab.rows), send.view(R, vs), 0);
  ASSIGN_OR_RETURN(WorkBuffer recv, ctx.workspace.Take(n * R * vs));
  RETURN_IF_ERROR(ctx.comm->AllGather(send.data(), R * vs, recv.data()));
  ASSIGN_OR_RETURN(WorkBuffer part, ctx.workspace.Take(R * vs));
  for (int q = 0; q < n; ++q) {
    const int64_t begin = std::min<int64_t>(q * vs, V);
    const int64_t width = std::min(vs, V - begin);
    if (width <= 0) continue;
    // The shard's columns, then their place in the row.
    const gpu::ConstMatrixView shard(recv.data() + q * R * vs, R, vs);
    backend.CopyColumns(shard, 0, part.view(R, width));
    backend.PlaceColumns(part.view(R, width), logits, begin);
  }
  return absl::OkStatus();
}

absl::Status VocabLogits(const LayerContext& ctx, const gpu::Weight& head,
                         const VocabShard& vocab, gpu::ConstMatrixView x,
                         std::vector<float>& logits) {
  const int64_t R = x.rows, V = ctx.dims.vocab_size;
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer all, ctx.workspace.Take(R * V));
  RETURN_IF_ERROR(VocabLogitsOnBackend(ctx, head, vocab, x, all.view(R, V)));
  logits.resize(static_cast<size_t>(R * V));
  ctx.backend.CopyToHost(all.data(), absl::MakeSpan(logits));
  return absl::OkStatus();
}

absl::Status Head(const LayerContext& ctx, const EmbeddingHeadWeights& w,
                  const VocabShard& vocab, const StepInput& input,
                  gpu::ConstMatrixView stream, gpu::ConstMatrixView final_pre,
                  StepOutput& out) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int64_t D = d.hidden_size, hc = d.hc_mult, V = d.vocab_size;
  // The rows: first every chunk's asked-for rows (they come to the host in
  // one copy), then the last row of each chunk that only draws.
  std::vector<int32_t> rows;
  std::vector<int64_t> counts;
  std::vector<int32_t> draw_only;
  int64_t t0 = 0;
  for (const SequenceChunk& c : input.chunks) {
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    int64_t count = 0;
    if (c.logits == SequenceChunk::Logits::kLast) {
      rows.push_back(static_cast<int32_t>(t0 + n - 1));
      count = 1;
    } else if (c.logits == SequenceChunk::Logits::kAll) {
      for (int64_t j = 0; j < n; ++j)
        rows.push_back(static_cast<int32_t>(t0 + j));
      count = n;
    } else if (c.sample) {
      draw_only.push_back(static_cast<int32_t>(t0 + n - 1));
    }
    counts.push_back(count);
    t0 += n;
  }
  const auto K = static_cast<int64_t>(rows.size());
  rows.insert(rows.end(), draw_only.begin(), draw_only.end());
  const auto R = static_cast<int64_t>(rows.size());
  if (R == 0) return absl::OkStatus();
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer xs, ctx.workspace.Take(R * hc * D));
  backend.GatherRows(stream, rows, xs.view(R, hc * D));
  ASSIGN_OR_RETURN(WorkBuffer xh, ctx.workspace.Take(R * D));
  if (d.IsV41()) {
    ASSIGN_OR_RETURN(WorkBuffer pre, ctx.workspace.Take(R * hc));
    backend.GatherRows(final_pre, rows, pre.view(R, hc));
    backend.HcCollapse(xs.view(R, hc * D), pre.view(R, hc),
                       static_cast<int>(hc), xh.view(R, D));
  } else {
    HcHead(ctx, w.hc_head, xs.view(R, hc * D), xh.view(R, D));
  }
  backend.RmsNorm(xh.view(R, D), w.norm->data(), d.rms_norm_eps, xh.view(R, D));
  ASSIGN_OR_RETURN(WorkBuffer all, ctx.workspace.Take(R * V));
  RETURN_IF_ERROR(
      VocabLogitsOnBackend(ctx, *w.head, vocab, xh.view(R, D), all.view(R, V)));
  // The draws where the logits are: the draw-only rows in one call, a chunk
  // that also asked for its rows from its last one.
  std::vector<gpu::SamplingParams> params;
  std::vector<size_t> drawers;
  int64_t r0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    if (c.sample && counts[i] == 0) {
      params.push_back(c.sampling);
      drawers.push_back(i);
    } else if (c.sample) {
      int32_t id = 0;
      float logprob = 0.0f;
      backend.Sample(
          gpu::ConstMatrixView(all.data() + (r0 + counts[i] - 1) * V, 1, V),
          {c.sampling}, absl::MakeSpan(&id, 1), absl::MakeSpan(&logprob, 1));
      out.sampled[i] = {.id = id, .logprob = logprob};
    }
    r0 += counts[i];
  }
  if (!drawers.empty()) {
    const auto S = static_cast<int64_t>(drawers.size());
    std::vector<int32_t> ids(S);
    std::vector<float> logprobs(S);
    backend.Sample(gpu::ConstMatrixView(all.data() + K * V, S, V), params,
                   absl::MakeSpan(ids), absl::MakeSpan(logprobs));
    for (int64_t s = 0; s < S; ++s) {
      out.sampled[drawers[s]] = {.id = ids[s], .logprob = logprobs[s]};
    }
  }
  if (K == 0) return absl::OkStatus();
  std::vector<float> logits(static_cast<size_t>(K * V));
  backend.CopyToHost(all.data(), absl::MakeSpan(logits));
  r0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    out.logits[i].assign(logits.begin() + r0 * V,
                         logits.begin() + (r0 + counts[i]) * V);
    r0 += counts[i];
  }
  return absl::OkStatus();
}

}  // namespace mneme::model
