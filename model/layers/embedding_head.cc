#include "model/layers/embedding_head.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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

absl::Status VocabLogits(const LayerContext& ctx, const gpu::Weight& head,
                         const VocabShard& vocab, gpu::ConstMatrixView x,
                         std::vector<float>& logits) {
  gpu::Backend& backend = ctx.backend;
  const int64_t R = x.rows, V = ctx.dims.vocab_size;
  Workspace::Scope scope(ctx.workspace);
  ASSIGN_OR_RETURN(WorkBuffer local, ctx.workspace.Take(R * vocab.rows));
  backend.Linear(x, head, local.view(R, vocab.rows));
  logits.assign(static_cast<size_t>(R * V), 0.0f);
  const int n = ctx.tp_size;
  if (n == 1) {
    backend.CopyToHost(local.data(), absl::MakeSpan(logits));
  } else {
    // Pad each rank's shard to vocab.shard columns, gather, unpad.
    const int64_t vs = vocab.shard;
    std::vector<float> mine(static_cast<size_t>(R * vs), 0.0f);
    std::vector<float> shard(static_cast<size_t>(R * vocab.rows));
    backend.CopyToHost(local.data(), absl::MakeSpan(shard));
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(mine.data() + r * vs, shard.data() + r * vocab.rows,
                  vocab.rows * sizeof(float));
    }
    ASSIGN_OR_RETURN(WorkBuffer send, ctx.workspace.Take(R * vs));
    ASSIGN_OR_RETURN(WorkBuffer recv, ctx.workspace.Take(n * R * vs));
    backend.CopyFromHost(mine, send.data());
    RETURN_IF_ERROR(ctx.comm->AllGather(send.data(), R * vs, recv.data()));
    std::vector<float> all(static_cast<size_t>(n * R * vs));
    backend.CopyToHost(recv.data(), absl::MakeSpan(all));
    for (int q = 0; q < n; ++q) {
      const int64_t begin = std::min<int64_t>(q * vs, V);
      const int64_t width = std::min(vs, V - begin);
      for (int64_t r = 0; r < R && width > 0; ++r) {
        std::memcpy(logits.data() + r * V + begin,
                    all.data() + (q * R + r) * vs, width * sizeof(float));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Head(const LayerContext& ctx, const EmbeddingHeadWeights& w,
                  const VocabShard& vocab, const StepInput& input,
                  gpu::ConstMatrixView stream, gpu::ConstMatrixView final_pre,
                  StepOutput& out) {
  const ModelDims& d = ctx.dims;
  gpu::Backend& backend = ctx.backend;
  const int64_t D = d.hidden_size, hc = d.hc_mult, V = d.vocab_size;
  std::vector<int32_t> rows;
  std::vector<int64_t> counts;
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
    }
    counts.push_back(count);
    t0 += n;
  }
  const int64_t R = static_cast<int64_t>(rows.size());
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
  std::vector<float> logits;
  RETURN_IF_ERROR(VocabLogits(ctx, *w.head, vocab, xh.view(R, D), logits));
  int64_t r0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    out.logits[i].assign(logits.begin() + r0 * V,
                         logits.begin() + (r0 + counts[i]) * V);
    r0 += counts[i];
  }
  return absl::OkStatus();
}

}  // namespace mneme::model
