#include "model/spec/dspark.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/status_macros.h"
#include "model/layers/attention.h"
#include "model/layers/hyper_connections.h"
#include "model/layers/layer_context.h"
#include "model/layers/moe.h"
#include "model/weight_loader.h"

namespace mneme::model {
namespace {

using gpu::ConstMatrixView;
using gpu::MatrixView;

// The workspace floats set aside at load; a larger batch grows it once.
constexpr int64_t kWorkspaceFloatsAtLoad = int64_t{1} << 20;

// The target's dims as the stages see them: window-only layers 0..S-1 with
// the stages' MoE, no hash routing, no Engram, no compressed cache.
absl::StatusOr<ModelDims> StageDims(const ModelDims& target) {
  if (target.dspark_block_size < 1 || target.num_draft_layers < 1 ||
      target.dspark_target_layers.empty() || target.dspark_markov_rank < 1) {
    return absl::InvalidArgumentError(
        "the checkpoint has no DSpark stages (dspark_block_size, "
        "num_nextn_predict_layers, dspark_target_layer_ids and "
        "dspark_markov_rank must be set)");
  }
  for (size_t s = 0; s < target.draft_compress_ratios.size(); ++s) {
    if (target.draft_compress_ratios[s] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compress_ratios: DSpark stage ", s, " has ratio ",
          target.draft_compress_ratios[s], "; the stages are window-only (0)"));
    }
  }
  ModelDims d = target;
  d.num_layers = target.num_draft_layers;
  d.compress_ratios.assign(d.num_layers, 0);
  d.kv_source_layers.clear();
  d.index_source_layers.clear();
  d.candidate_source_layer = -1;
  d.num_hash_layers = 0;
  d.engram_layers.clear();
  if (target.draft_num_experts > 0) d.num_experts = target.draft_num_experts;
  if (target.draft_experts_per_token > 0) {
    d.experts_per_token = target.draft_experts_per_token;
  }
  return d;
}

KvCacheOptions RingOptions(const DsparkOptions& options) {
  KvCacheOptions o;
  o.budget_bytes = options.ring_budget_bytes;
  return o;
}

}  // namespace

uint64_t DraftSeed(uint64_t step_seed) {
  uint64_t z = step_seed ^ 0xD6E8FEB86659FD93ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int UsableDrafts(absl::Span<const int64_t> drafts, int k,
                 int64_t engram_vocab_size) {
  int n = std::min(k, static_cast<int>(drafts.size()));
  if (engram_vocab_size <= 0) return std::max(n, 0);
  for (int i = 0; i < n; ++i) {
    if (drafts[i] >= engram_vocab_size) return i;
  }
  return std::max(n, 0);
}

DsparkDrafter::DsparkDrafter(const DsparkOptions& options, ModelDims dims,
                             gpu::Backend& backend, gpu::Communicator* comm,
                             const EmbeddingHeadWeights& shared,
                             const VocabShard& vocab)
    : options_(options),
      dims_(std::move(dims)),
      backend_(backend),
      comm_(comm),
      shared_(shared),
      vocab_(vocab) {}

DsparkDrafter::~DsparkDrafter() = default;

absl::StatusOr<std::unique_ptr<DsparkDrafter>> DsparkDrafter::Create(
    const DsparkOptions& options, const ModelDims& dims, gpu::Backend& backend,
    gpu::Communicator* comm, const EmbeddingHeadWeights& shared,
    const VocabShard& vocab) {
  ASSIGN_OR_RETURN(ModelDims d, StageDims(dims));
  RETURN_IF_ERROR(CheckTensorParallel(d, options.tp_size));
  if (options.tp_size > 1 &&
      (comm == nullptr || comm->size() != options.tp_size ||
       comm->rank() != options.tp_rank)) {
    return absl::InvalidArgumentError(
        "tensor parallelism needs a communicator of the same rank and size");
  }
  if (shared.embed == nullptr || shared.head == nullptr) {
    return absl::InvalidArgumentError("the target's embedding/head is missing");
  }
  std::unique_ptr<DsparkDrafter> drafter(
      new DsparkDrafter(options, std::move(d), backend, comm, shared, vocab));
  RETURN_IF_ERROR(drafter->Load());
  ASSIGN_OR_RETURN(
      drafter->rings_,
      KvCache::Create(RingOptions(options), drafter->dims_.head_dim, backend));
  ASSIGN_OR_RETURN(drafter->workspace_,
                   Workspace::Create(backend, kWorkspaceFloatsAtLoad));
  return drafter;
}

absl::Status DsparkDrafter::Load() {
  const ModelDims& d = dims_;
  ASSIGN_OR_RETURN(
      std::unique_ptr<checkpoint::ShardedCheckpoint> ckpt,
      checkpoint::ShardedCheckpoint::Create(options_.checkpoint_dir));
  WeightLoader load(*ckpt, backend_, d.fp8_block_rows, d.fp8_block_cols,
                    ckpt->dir());
  ASSIGN_OR_RETURN(const std::unique_ptr<checkpoint::GridbookArtifact> gridbook,
                   checkpoint::GridbookArtifact::Open(ckpt->dir()));
  load.set_gridbook(gridbook.get());
  const int64_t D = d.hidden_size, r = d.dspark_markov_rank;
  const int64_t taps = static_cast<int64_t>(d.dspark_target_layers.size());
  const int rank = options_.tp_rank, n = options_.tp_size;
  for (int s = 0; s < d.num_layers; ++s) {
    const std::string p = absl::StrCat("mtp.", s, ".");
    LayerWeights w;
    ASSIGN_OR_RETURN(w.attn_norm, load.Vector(p + "attn_norm.weight", {D}));
    ASSIGN_OR_RETURN(w.ffn_norm, load.Vector(p + "ffn_norm.weight", {D}));
    ASSIGN_OR_RETURN(w.hc_attn, LoadHcSublayerWeights(load, p + "hc_attn", d));
    ASSIGN_OR_RETURN(w.hc_ffn, LoadHcSublayerWeights(load, p + "hc_ffn", d));
    ASSIGN_OR_RETURN(w.attn,
                     LoadAttentionWeights(load, p + "attn.", d, s, rank, n));
    ASSIGN_OR_RETURN(w.ffn, LoadMoeWeights(load, p + "ffn.", d, s, rank, n));
    stages_.push_back(std::move(w));
  }
  ASSIGN_OR_RETURN(main_proj_, load.Linear("mtp.0.main_proj", D, taps * D));
  ASSIGN_OR_RETURN(main_norm_, load.Vector("mtp.0.main_norm.weight", {D}));
  const std::string last = absl::StrCat("mtp.", d.num_layers - 1, ".");
  ASSIGN_OR_RETURN(norm_, load.Vector(last + "norm.weight", {D}));
  if (!d.IsV41()) {
    // V4-Flash-0731: the last stage collapses with its own head mix.
    ASSIGN_OR_RETURN(hc_head_, LoadHcHeadWeights(load, d, last));
  }
  // V4.1 names the Markov head's tensors embed / head; V4-Flash-0731's
  // markov_w1 / markov_w2.
  const std::string mh = last + "markov_head.";
  const bool w_names = load.Has(mh + "markov_w1.weight");
  const Slice rows{vocab_.begin, vocab_.rows};
  ASSIGN_OR_RETURN(markov_embed_,
                   load.Linear(mh + (w_names ? "markov_w1" : "embed"),
                               d.vocab_size, r, rows));
  ASSIGN_OR_RETURN(markov_head_,
                   load.Linear(mh + (w_names ? "markov_w2" : "head"),
                               d.vocab_size, r, rows));
  ASSIGN_OR_RETURN(confidence_,
                   load.Linear(last + "confidence_head.proj", 1, D + r));
  return absl::OkStatus();
}

LayerContext DsparkDrafter::Context() {
  return LayerContext{
      .dims = dims_,
      .backend = backend_,
      .workspace = *workspace_,
      .tp_rank = options_.tp_rank,
      .tp_size = options_.tp_size,
      .comm = comm_,
      .dcp = DcpLayout{.rank = options_.tp_rank, .size = 1, .interleave = 1},
  };
}

int64_t DsparkDrafter::SequenceLength(uint64_t sequence_id) const {
  auto it = sequences_.find(sequence_id);
  return it == sequences_.end() ? -1 : it->second.length;
}

void DsparkDrafter::Release(uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return;
  for (std::vector<int32_t>& blocks : it->second.rings) rings_->Free(blocks);
  sequences_.erase(it);
}

void DsparkDrafter::ReleaseAll() {
  for (auto& [id, seq] : sequences_) {
    for (std::vector<int32_t>& blocks : seq.rings) rings_->Free(blocks);
  }
  sequences_.clear();
}

absl::Status DsparkDrafter::Extend(uint64_t sequence_id, int64_t first,
                                   int64_t count,
                                   absl::Span<const float> taps) {
  const ModelDims& d = dims_;
  const int64_t D = d.hidden_size, hd = d.head_dim;
  const int64_t L = static_cast<int64_t>(d.dspark_target_layers.size());
  const int64_t W = d.sliding_window;
  const int64_t have = SequenceLength(sequence_id);
  if (first != std::max<int64_t>(have, 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", sequence_id, ": the drafter holds ",
                     std::max<int64_t>(have, 0), " positions, not ", first));
  }
  if (taps.empty() || taps.size() % (L * D) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "taps: ", taps.size(), " floats is not a positive multiple of ", L,
        " target layers x ", D));
  }
  // The taps are of the last `given` of the `count` positions; the rings
  // need the last min(count, W).
  const int64_t given = static_cast<int64_t>(taps.size()) / (L * D);
  if (count < 1 || given > count || given < std::min(count, W)) {
    return absl::InvalidArgumentError(
        absl::StrCat("taps of ", given, " positions for ", count,
                     " new positions: at least min(count, window ", W,
                     ") and at most count are needed"));
  }
  const int64_t n = count;
  if (have < 0) {
    SequenceRings seq;
    seq.rings.resize(d.num_layers);
    absl::Status st;
    for (std::vector<int32_t>& blocks : seq.rings) {
      st.Update(rings_->Allocate(
          static_cast<int>(CeilDiv(W, rings_->block_rows())), blocks));
    }
    if (!st.ok()) {
      for (std::vector<int32_t>& blocks : seq.rings) rings_->Free(blocks);
      return absl::ResourceExhaustedError(absl::StrCat(
          "the DSpark rings are full (", rings_->free_blocks(), " of ",
          rings_->num_blocks(), " blocks free): ", st.message()));
    }
    sequences_[sequence_id] = std::move(seq);
  }
  SequenceRings& seq = sequences_.at(sequence_id);
  // Only the last W positions reach the rings.
  const int64_t skip = std::max<int64_t>(n - W, 0);
  const int64_t m = n - skip;
  Workspace::Scope scope(*workspace_);
  ASSIGN_OR_RETURN(WorkBuffer t, workspace_->Take(m * L * D));
  backend_.CopyFromHost(taps.subspan((given - m) * L * D), t.data());
  ASSIGN_OR_RETURN(WorkBuffer main_x, workspace_->Take(m * D));
  backend_.Linear(t.view(m, L * D), *main_proj_, main_x.view(m, D));
  backend_.RmsNorm(main_x.view(m, D), main_norm_->data(), d.rms_norm_eps,
                   main_x.view(m, D));
  std::vector<int32_t> positions(m), slots(m);
  ASSIGN_OR_RETURN(WorkBuffer kv, workspace_->Take(m * hd));
  for (int s = 0; s < d.num_layers; ++s) {
    const AttentionWeights& a = stages_[s].attn;
    backend_.Linear(main_x.view(m, D), *a.wkv, kv.view(m, hd));
    backend_.RmsNorm(kv.view(m, hd), a.kv_norm->data(), d.rms_norm_eps,
                     kv.view(m, hd));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t p = first + skip + i;
      positions[i] = static_cast<int32_t>(p);
      slots[i] = rings_->Row(seq.rings[s], p % W);
    }
    backend_.Rope(kv.view(m, hd), static_cast<int>(hd), d.rope_dim, a.rope,
                  positions, gpu::Backend::RopeDirection::kForward);
    backend_.ScatterRows(kv.view(m, hd), slots, rings_->pool());
  }
  seq.length = first + n;
  return absl::OkStatus();
}

absl::Status DsparkDrafter::StageAttention(
    const LayerContext& ctx, int s, absl::Span<const DraftRequest> requests,
    const std::vector<int32_t>& positions, ConstMatrixView xn, MatrixView out) {
  const ModelDims& d = dims_;
  const AttentionWeights& w = stages_[s].attn;
  Workspace& ws = *workspace_;
  const int64_t R = xn.rows, hd = d.head_dim, ql = d.q_lora_rank;
  const int64_t hl = d.num_heads / options_.tp_size;
  const int64_t bs = block_size(), W = d.sliding_window;
  Workspace::Scope scope(ws);
  ASSIGN_OR_RETURN(WorkBuffer qa, ws.Take(R * ql));
  ASSIGN_OR_RETURN(WorkBuffer q, ws.Take(R * hl * hd));
  // One key matrix for every request: each one's filled ring slots (the
  // last min(W, length) committed positions), gathered, then every block's
  // own keys, which the projection writes in place. A block's queries see
  // their request's ring keys, then all of their block's keys, in one
  // attention call for every request.
  const int64_t B = static_cast<int64_t>(requests.size());
  std::vector<int32_t> ring_rows;
  std::vector<int64_t> first_ring(B), filled(B);
  int64_t most_filled = 0;
  for (int64_t b = 0; b < B; ++b) {
    const SequenceRings& seq = sequences_.at(requests[b].sequence_id);
    filled[b] = std::min(W, seq.length);
    first_ring[b] = static_cast<int64_t>(ring_rows.size());
    most_filled = std::max(most_filled, filled[b]);
    for (int64_t i = 0; i < filled[b]; ++i) {
      ring_rows.push_back(rings_->Row(seq.rings[s], i));
    }
  }
  const int64_t F = static_cast<int64_t>(ring_rows.size());
  ASSIGN_OR_RETURN(WorkBuffer keys, ws.Take((F + R) * hd));
  const MatrixView keys_view = keys.view(F + R, hd);
  ProjectQueryKv(ctx, w, xn, positions, qa.view(R, ql), q.view(R, hl * hd),
                 Rows(keys_view, F, R));
  if (F > 0)
    backend_.GatherRows(rings_->pool(), ring_rows, Rows(keys_view, 0, F));
  ASSIGN_OR_RETURN(WorkBuffer o, ws.Take(R * hl * hd));
  ASSIGN_OR_RETURN(WorkBuffer lse, ws.Take(R * hl));
  const int64_t width = most_filled + bs;
  std::vector<int32_t> idx(R * width, -1);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < bs; ++j) {
      int32_t* row = idx.data() + (b * bs + j) * width;
      for (int64_t i = 0; i < filled[b]; ++i) {
        *row++ = static_cast<int32_t>(first_ring[b] + i);
      }
      for (int64_t k = 0; k < bs; ++k) {
        *row++ = static_cast<int32_t>(F + b * bs + k);
      }
    }
  }
  backend_.SparseAttention(
      q.view(R, hl * hd), keys_view, static_cast<int>(hl), idx,
      static_cast<int>(width), 1.0f / std::sqrt(static_cast<float>(hd)),
      w.attn_sink->data(), o.view(R, hl * hd), lse.view(R, hl));
  backend_.Rope(o.view(R, hl * hd), static_cast<int>(hd), d.rope_dim, w.rope,
                positions, gpu::Backend::RopeDirection::kInverse);
  RETURN_IF_ERROR(OutputProjection(ctx, w, o.view(R, hl * hd), out));
  return ctx.AllReduce(out);
}

absl::StatusOr<std::vector<DraftProposal>> DsparkDrafter::Propose(
    absl::Span<const DraftRequest> requests) {
  const ModelDims& d = dims_;
  const int64_t D = d.hidden_size, hc = d.hc_mult, V = d.vocab_size;
  const int64_t bs = block_size(), r = d.dspark_markov_rank;
  const int64_t B = static_cast<int64_t>(requests.size());
  absl::flat_hash_set<uint64_t> seen;
  for (const DraftRequest& q : requests) {
    const int64_t len = SequenceLength(q.sequence_id);
    if (len < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", q.sequence_id,
                       " has no committed positions in the drafter"));
    }
    if (!seen.insert(q.sequence_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", q.sequence_id, " is proposed twice"));
    }
    if (q.anchor < 0 || q.anchor >= V) {
      return absl::InvalidArgumentError(absl::StrCat(
          "anchor ", q.anchor, " is outside the vocabulary [0, ", V, ")"));
    }
  }
  std::vector<DraftProposal> out(B);
  if (B == 0) return out;
  const int64_t R = B * bs;
  std::vector<int32_t> ids(R), positions(R);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = sequences_.at(requests[b].sequence_id).length;
    for (int64_t j = 0; j < bs; ++j) {
      ids[b * bs + j] = static_cast<int32_t>(j == 0 ? requests[b].anchor
                                                    : d.dspark_noise_token);
      positions[b * bs + j] = static_cast<int32_t>(len + j);
    }
  }
  const LayerContext ctx = Context();
  Workspace& ws = *workspace_;
  Workspace::Scope scope(ws);
  ASSIGN_OR_RETURN(WorkBuffer stream, ws.Take(R * hc * D));
  const MatrixView X = stream.view(R, hc * D);
  RETURN_IF_ERROR(Embed(ctx, shared_, vocab_, ids, X));
  ASSIGN_OR_RETURN(HcScratch hcs, TakeHcScratch(ws, R, d));
  ASSIGN_OR_RETURN(WorkBuffer xn, ws.Take(R * D));
  // The staggered mixing of V4.1 blocks, starting from copy 0
  // (make_identity_pre_mix).
  ASSIGN_OR_RETURN(WorkBuffer carry, ws.TakeZeroed(R * hc));
  ASSIGN_OR_RETURN(WorkBuffer attn_pre, ws.Take(R * hc));
  {
    std::vector<float> one_hot(R * hc, 0.0f);
    for (int64_t t = 0; t < R; ++t) one_hot[t * hc] = 1.0f;
    backend_.CopyFromHost(one_hot, carry.data());
  }
  // V4.1 stages collapse each sub-layer's input with the mix the sub-layer
  // before computed; V4 (0731) stages with their own, as the target does.
  const bool v41 = d.IsV41();
  for (int s = 0; s < d.num_layers; ++s) {
    const LayerWeights& lw = stages_[s];
    {
      Workspace::Scope sublayer(ws);
      HcMix(ctx, lw.hc_attn, X, hcs);
      const MatrixView src = HcCollapse(
          ctx, X, v41 ? carry.view(R, hc) : hcs.pre.view(R, hc), hcs);
      backend_.CopyColumns(hcs.pre.view(R, hc), 0, attn_pre.view(R, hc));
      backend_.RmsNorm(src, lw.attn_norm->data(), d.rms_norm_eps,
                       xn.view(R, D));
      ASSIGN_OR_RETURN(WorkBuffer a, ws.Take(R * D));
      RETURN_IF_ERROR(StageAttention(ctx, s, requests, positions, xn.view(R, D),
                                     a.view(R, D)));
      HcPost(ctx, a.view(R, D), hcs, X);
    }
    {
      Workspace::Scope sublayer(ws);
      HcMix(ctx, lw.hc_ffn, X, hcs);
      const MatrixView src = HcCollapse(
          ctx, X, v41 ? attn_pre.view(R, hc) : hcs.pre.view(R, hc), hcs);
      backend_.CopyColumns(hcs.pre.view(R, hc), 0, carry.view(R, hc));
      backend_.RmsNorm(src, lw.ffn_norm->data(), d.rms_norm_eps, xn.view(R, D));
      ASSIGN_OR_RETURN(WorkBuffer a, ws.TakeZeroed(R * D));
      RETURN_IF_ERROR(
          MoeForward(ctx, lw.ffn, ids, xn.view(R, D), a.view(R, D)));
      HcPost(ctx, a.view(R, D), hcs, X);
    }
  }
  // forward_head: collapse (V4.1: with the last FFN mix; V4: with the last
  // stage's hc_head), the last stage's norm, the target's head.
  ASSIGN_OR_RETURN(WorkBuffer xh, ws.Take(R * D));
  if (v41) {
    backend_.HcCollapse(X, carry.view(R, hc), static_cast<int>(hc),
                        xh.view(R, D));
  } else {
    HcHead(ctx, hc_head_, X, xh.view(R, D));
  }
  ASSIGN_OR_RETURN(WorkBuffer hn, ws.Take(R * D));
  backend_.RmsNorm(xh.view(R, D), norm_->data(), d.rms_norm_eps, hn.view(R, D));
  std::vector<float> logits;
  RETURN_IF_ERROR(
      VocabLogits(ctx, *shared_.head, vocab_, hn.view(R, D), logits));
  // The Markov head, serially: draft i's logits get the bias of the token
  // before it (the anchor for i = 0), then draft i is drawn.
  ASSIGN_OR_RETURN(WorkBuffer memb, ws.Take(B * r));
  ASSIGN_OR_RETURN(WorkBuffer all_memb, ws.Take(R * r));
  ASSIGN_OR_RETURN(WorkBuffer row, ws.Take(B * V));
  std::vector<int32_t> prev(B), drawn(B), block_rows(B);
  std::vector<float> lps(B), bias;
  std::vector<gpu::SamplingParams> params(B);
  for (int64_t b = 0; b < B; ++b) {
    prev[b] = static_cast<int32_t>(requests[b].anchor);
    out[b].tokens.resize(bs);
  }
  for (int64_t i = 0; i < bs; ++i) {
    backend_.Embedding(prev, vocab_.begin, *markov_embed_, memb.view(B, r));
    RETURN_IF_ERROR(ctx.AllReduce(memb.view(B, r)));
    for (int64_t b = 0; b < B; ++b) {
      block_rows[b] = static_cast<int32_t>(b * bs + i);
    }
    backend_.ScatterRows(memb.view(B, r), block_rows, all_memb.view(R, r));
    RETURN_IF_ERROR(
        VocabLogits(ctx, *markov_head_, vocab_, memb.view(B, r), bias));
    for (int64_t b = 0; b < B; ++b) {
      float* lg = logits.data() + (b * bs + i) * V;
      const float* bi = bias.data() + b * V;
      for (int64_t v = 0; v < V; ++v) lg[v] += bi[v];
      backend_.CopyFromHost(absl::MakeConstSpan(lg, V), row.data() + b * V);
      params[b] = requests[b].sampling;
      params[b].seed = requests[b].sampling.seed + static_cast<uint64_t>(i);
    }
    backend_.Sample(row.view(B, V), params, absl::MakeSpan(drawn),
                    absl::MakeSpan(lps));
    for (int64_t b = 0; b < B; ++b) {
      out[b].tokens[i] = drawn[b];
      prev[b] = drawn[b];
    }
  }
  // The confidence head: proj(cat[x_i, markov_embed_i]) with x_i the
  // collapsed stream before the norm.
  ASSIGN_OR_RETURN(WorkBuffer cin, ws.Take(R * (D + r)));
  backend_.PlaceColumns(xh.view(R, D), cin.view(R, D + r), 0);
  backend_.PlaceColumns(all_memb.view(R, r), cin.view(R, D + r), D);
  ASSIGN_OR_RETURN(WorkBuffer conf, ws.Take(R));
  backend_.Linear(cin.view(R, D + r), *confidence_, conf.view(R, 1));
  std::vector<float> confidence(R);
  backend_.CopyToHost(conf.data(), absl::MakeSpan(confidence));
  for (int64_t b = 0; b < B; ++b) {
    out[b].logits.assign(logits.begin() + b * bs * V,
                         logits.begin() + (b + 1) * bs * V);
    out[b].confidence.assign(confidence.begin() + b * bs,
                             confidence.begin() + (b + 1) * bs);
  }
  return out;
}

}  // namespace mneme::model
