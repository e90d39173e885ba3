#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/engram_config_loader.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "engram_store/hashing/column_split.h"
#include "formats/bf16.h"
#include "model/weight_loader.h"

namespace mneme::model {
namespace {

using gpu::Backend;
using gpu::ConstMatrixView;
using gpu::MatrixView;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [begin, begin + count) of a matrix view.
MatrixView Rows(MatrixView m, int64_t begin, int64_t count) {
  return MatrixView{m.data + begin * m.cols, count, m.cols};
}

// Most rows one Engram Lookup may ask for (RequestLimits' default); larger
// chunks use LookupStream.
constexpr int64_t kMaxRowsPerLookup = 65536;

}  // namespace

struct ExpertWeights {
  std::unique_ptr<gpu::Weight> w1, w2, w3;
};

struct LayerWeights {
  std::unique_ptr<gpu::Buffer> attn_norm, ffn_norm;
  std::unique_ptr<gpu::Weight> hc_attn_fn, hc_ffn_fn;
  std::unique_ptr<gpu::Buffer> hc_attn_base, hc_attn_scale, hc_ffn_base,
      hc_ffn_scale;
  std::unique_ptr<gpu::Weight> wq_a, wq_b, wkv, wo_b;
  // One per local head group.
  std::vector<std::unique_ptr<gpu::Weight>> wo_a;
  std::unique_ptr<gpu::Buffer> q_norm, kv_norm, attn_sink;
  // Compressor (ratio > 0).
  std::unique_ptr<gpu::Weight> c_wkv, c_wgate;
  std::unique_ptr<gpu::Buffer> c_ape, c_norm;
  // MoE.
  std::unique_ptr<gpu::Weight> gate;
  std::unique_ptr<gpu::Buffer> gate_bias;  // May be null.
  std::vector<ExpertWeights> experts;      // This rank's, by local index.
  ExpertWeights shared;                    // Null members: none here.
  // Engram.
  std::unique_ptr<gpu::Weight> engram_wkv;
  std::unique_ptr<gpu::Buffer> engram_q, engram_k;
};

struct Model::Weights {
  std::unique_ptr<gpu::Weight> embed, head;
  std::unique_ptr<gpu::Buffer> norm;
  std::unique_ptr<gpu::Weight> hc_head_fn;
  std::unique_ptr<gpu::Buffer> hc_head_base, hc_head_scale;
  std::vector<LayerWeights> layers;
};

struct Model::Sequence {
  // Tokens processed so far (the Engram hashes need the history).
  std::vector<int64_t> tokens;
  struct LayerState {
    std::vector<int32_t> window;   // Ring of sliding_window rows.
    std::vector<int32_t> entries;  // Compressed entries, in order.
    std::vector<int32_t> partial;  // Compressor: r kv rows, then r scores.
  };
  std::vector<LayerState> layers;
};

Model::Model(const ModelOptions& options, ModelDims dims, Backend& backend,
             gpu::Communicator* comm, engram::EngramClient* engram)
    : options_(options),
      dims_(std::move(dims)),
      backend_(backend),
      comm_(comm),
      engram_(engram) {}

Model::~Model() {
  for (auto& [id, seq] : sequences_) {
    for (Sequence::LayerState& l : seq->layers) {
      kv_cache_->Free(l.window);
      kv_cache_->Free(l.entries);
      kv_cache_->Free(l.partial);
    }
  }
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelOptions& options, Backend& backend, gpu::Communicator* comm,
    engram::EngramClient* engram) {
  if (options.tp_size < 1 || options.tp_rank < 0 ||
      options.tp_rank >= options.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_rank=", options.tp_rank,
                     " must be in [0, tp_size=", options.tp_size, ")"));
  }
  absl::StatusOr<std::unique_ptr<checkpoint::ModelConfig>> config =
      checkpoint::ModelConfig::Create(options.checkpoint_dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<ModelDims> dims = LoadModelDims(**config);
  if (!dims.ok()) return dims.status();
  if (absl::Status st = CheckTensorParallel(*dims, options.tp_size); !st.ok()) {
    return st;
  }
  if (options.dcp_size != 1 && options.dcp_size != options.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp_size=", options.dcp_size,
                     " must be 1 or the tp_size (", options.tp_size,
                     "): decode context parallelism runs on the "
                     "tensor-parallel ranks"));
  }
  if (options.dcp_interleave < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dcp_interleave=", options.dcp_interleave, " must be >= 1"));
  }
  if (options.tp_size > 1 &&
      (comm == nullptr || comm->size() != options.tp_size ||
       comm->rank() != options.tp_rank)) {
    return absl::InvalidArgumentError(
        "tensor parallelism needs a communicator of the same rank and size");
  }
  std::unique_ptr<Model> model(
      new Model(options, *std::move(dims), backend, comm, engram));
  if (!model->dims_.engram_layers.empty()) {
    if (engram == nullptr) {
      return absl::InvalidArgumentError(
          "the model has Engram layers but no Engram client was given");
    }
    absl::StatusOr<checkpoint::EngramConfig> ec =
        checkpoint::ParseEngramConfig(**config);
    if (!ec.ok()) return ec.status();
    model->engram_num_columns_ = ec->NumColumns();
    model->engram_row_dim_ = ec->head_dim;
    model->engram_context_ = ec->max_ngram_size - 1;
    for (int r = 0; r < options.tp_size; ++r) {
      absl::StatusOr<std::vector<int>> cols =
          engram::RankColumns(engram::ColumnSplit::kStrided, ec->NumColumns(),
                              ec->n_heads, options.tp_size, r);
      if (!cols.ok()) return cols.status();
      model->engram_columns_.push_back(*std::move(cols));
    }
  }
  if (absl::Status st = model->Load(); !st.ok()) return st;
  const int64_t row_floats = model->dims_.head_dim;
  absl::StatusOr<std::unique_ptr<KvCache>> cache =
      KvCache::Create(options.kv_cache, row_floats, backend);
  if (!cache.ok()) return cache.status();
  model->kv_cache_ = *std::move(cache);
  return model;
}

absl::Status Model::Load() {
  absl::StatusOr<std::unique_ptr<checkpoint::ShardedCheckpoint>> ckpt =
      checkpoint::ShardedCheckpoint::Create(options_.checkpoint_dir);
  if (!ckpt.ok()) return ckpt.status();
  WeightLoader load(**ckpt, backend_, dims_.fp8_block_rows,
                    dims_.fp8_block_cols);
  const ModelDims& d = dims_;
  const int n = options_.tp_size, rank = options_.tp_rank;
  const int64_t D = d.hidden_size, hd = d.head_dim, hc = d.hc_mult;
  vocab_shard_ = CeilDiv(d.vocab_size, n);
  vocab_begin_ = std::min<int64_t>(rank * vocab_shard_, d.vocab_size);
  vocab_rows_ = std::min(vocab_shard_, d.vocab_size - vocab_begin_);
  if (vocab_rows_ <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", n, " leaves rank ", rank,
                     " no rows of the ", d.vocab_size, "-token vocabulary"));
  }
  auto w = std::make_unique<Weights>();
  absl::Status st;
  // Assigns the value of a StatusOr to `dst`, keeping the first error.
  auto take = [&st](auto&& result, auto& dst) {
    if (!st.ok()) return;
    if (!result.ok()) {
      st = result.status();
      return;
    }
    dst = *std::move(result);
  };
  const Slice vocab{vocab_begin_, vocab_rows_};
  take(load.Linear("embed", d.vocab_size, D, vocab), w->embed);
  take(load.Linear("head", d.vocab_size, D, vocab), w->head);
  take(load.Vector("norm.weight", {D}), w->norm);
  if (hc > 1) {
    take(load.FloatMatrix("hc_head_fn", hc, hc * D), w->hc_head_fn);
    take(load.Vector("hc_head_base", {hc}), w->hc_head_base);
    take(load.Vector("hc_head_scale", {1}), w->hc_head_scale);
  }
  const int64_t heads_local = d.num_heads / n;
  const int64_t groups_local = d.o_groups / n;
  const int64_t heads_per_group = d.num_heads / d.o_groups;
  const int64_t experts_local = d.num_experts / n;
  const int64_t shared_inter = d.num_shared_experts * d.moe_intermediate;
  w->layers.resize(d.num_layers);
  for (int l = 0; l < d.num_layers && st.ok(); ++l) {
    LayerWeights& lw = w->layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    take(load.Vector(p + "attn_norm.weight", {D}), lw.attn_norm);
    take(load.Vector(p + "ffn_norm.weight", {D}), lw.ffn_norm);
    if (hc > 1) {
      const int64_t mix = (2 + hc) * hc;
      take(load.FloatMatrix(p + "hc_attn_fn", mix, hc * D), lw.hc_attn_fn);
      take(load.Vector(p + "hc_attn_base", {mix}), lw.hc_attn_base);
      take(load.Vector(p + "hc_attn_scale", {3}), lw.hc_attn_scale);
      take(load.FloatMatrix(p + "hc_ffn_fn", mix, hc * D), lw.hc_ffn_fn);
      take(load.Vector(p + "hc_ffn_base", {mix}), lw.hc_ffn_base);
      take(load.Vector(p + "hc_ffn_scale", {3}), lw.hc_ffn_scale);
    }
    const std::string a = p + "attn.";
    take(load.Linear(a + "wq_a", d.q_lora_rank, D), lw.wq_a);
    take(load.Vector(a + "q_norm.weight", {d.q_lora_rank}), lw.q_norm);
    take(load.Linear(a + "wq_b", d.num_heads * hd, d.q_lora_rank,
                     Slice{rank * heads_local * hd, heads_local * hd}),
         lw.wq_b);
    take(load.Linear(a + "wkv", hd, D), lw.wkv);
    take(load.Vector(a + "kv_norm.weight", {hd}), lw.kv_norm);
    lw.wo_a.resize(groups_local);
    for (int64_t g = 0; g < groups_local; ++g) {
      take(load.Linear(
               a + "wo_a", d.o_groups * d.o_lora_rank, heads_per_group * hd,
               Slice{(rank * groups_local + g) * d.o_lora_rank, d.o_lora_rank}),
           lw.wo_a[g]);
    }
    take(load.Linear(a + "wo_b", D, d.o_groups * d.o_lora_rank, {},
                     Slice{rank * groups_local * d.o_lora_rank,
                           groups_local * d.o_lora_rank}),
         lw.wo_b);
    take(load.Vector(a + "attn_sink", {d.num_heads}, rank * heads_local,
                     heads_local),
         lw.attn_sink);
    if (const int r = d.compress_ratios[l]; r > 0) {
      take(load.Linear(a + "compressor.wkv", hd, D), lw.c_wkv);
      take(load.Linear(a + "compressor.wgate", hd, D), lw.c_wgate);
      take(load.Vector(a + "compressor.ape", {r, hd}), lw.c_ape);
      take(load.Vector(a + "compressor.norm.weight", {hd}), lw.c_norm);
    }
    const std::string f = p + "ffn.";
    take(load.Linear(f + "gate", d.num_experts, D), lw.gate);
    if (st.ok() && (*ckpt)->FindOrNull(f + "gate.bias") != nullptr) {
      take(load.Vector(f + "gate.bias", {d.num_experts}), lw.gate_bias);
    }
    lw.experts.resize(experts_local);
    for (int64_t e = 0; e < experts_local && st.ok(); ++e) {
      const std::string x =
          absl::StrCat(f, "experts.", rank * experts_local + e, ".");
      ExpertWeights& ew = lw.experts[e];
      take(load.Linear(x + "w1", d.moe_intermediate, D), ew.w1);
      take(load.Linear(x + "w3", d.moe_intermediate, D), ew.w3);
      take(load.Linear(x + "w2", D, d.moe_intermediate), ew.w2);
    }
    if (shared_inter > 0) {
      // Split by intermediate columns when they divide evenly; else rank 0
      // holds the whole shared expert.
      const bool split = shared_inter % n == 0;
      const int64_t part = split ? shared_inter / n : shared_inter;
      if (split || rank == 0) {
        const Slice s{split ? rank * part : 0, part};
        const std::string x = f + "shared_experts.";
        take(load.Linear(x + "w1", shared_inter, D, s), lw.shared.w1);
        take(load.Linear(x + "w3", shared_inter, D, s), lw.shared.w3);
        take(load.Linear(x + "w2", D, shared_inter, {}, s), lw.shared.w2);
      }
    }
    if (d.IsEngramLayer(l)) {
      const std::string e = p + "engram.";
      take(load.Linear(e + "wkv", (hc + 1) * D,
                       int64_t{engram_num_columns_} * engram_row_dim_),
           lw.engram_wkv);
      take(load.Vector(e + "q_weight", {hc, D}), lw.engram_q);
      take(load.Vector(e + "k_weight", {hc, D}), lw.engram_k);
    }
  }
  if (!st.ok()) return st;
  weight_bytes_ = load.uploaded_bytes();
  weights_ = std::move(w);
  return absl::OkStatus();
}

int64_t Model::SequenceLength(uint64_t sequence_id) const {
  auto it = sequences_.find(sequence_id);
  return it == sequences_.end()
             ? -1
             : static_cast<int64_t>(it->second->tokens.size());
}

void Model::Prefetch(const std::vector<PrefetchHint>& hints) {
  if (engram_ == nullptr || dims_.engram_layers.empty()) return;
  const std::vector<int>& mine = engram_columns_[options_.tp_rank];
  for (const PrefetchHint& h : hints) {
    if (h.tokens.empty()) continue;
    const size_t ctx = std::min<size_t>(h.context.size(), engram_context_);
    for (int layer : dims_.engram_layers) {
      engram::v1::PrefetchRequest req;
      req.set_layer_id(layer);
      for (size_t k = h.context.size() - ctx; k < h.context.size(); ++k) {
        req.add_token_ids(h.context[k]);
      }
      for (int64_t t : h.tokens) req.add_token_ids(t);
      req.set_context_token_count(static_cast<int32_t>(ctx));
      for (int col : mine) req.add_columns(col);
      // Best effort by design: a dropped or failed prefetch only means the
      // step that needs the rows reads them itself.
      (void)engram_->Prefetch(req);
    }
  }
}

void Model::Release(uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return;
  for (Sequence::LayerState& l : it->second->layers) {
    kv_cache_->Free(l.window);
    kv_cache_->Free(l.entries);
    kv_cache_->Free(l.partial);
  }
  sequences_.erase(it);
}

absl::Status Model::Validate(const StepInput& input) const {
  absl::flat_hash_set<uint64_t> seen;
  int64_t total = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    if (!seen.insert(c.sequence_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", c.sequence_id, " appears twice in a step"));
    }
    if (c.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", c.sequence_id, " has no tokens"));
    }
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      if (c.tokens[t] < 0 || c.tokens[t] >= dims_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", c.sequence_id, ": token ", c.tokens[t], " at index ",
            t, " is outside the vocabulary [0, ", dims_.vocab_size, ")"));
      }
    }
    const int64_t have = std::max<int64_t>(SequenceLength(c.sequence_id), 0);
    if (c.start_position != have) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", c.sequence_id, " starts at position ", c.start_position,
          " but the worker holds ", have, " of its tokens"));
    }
    if (c.start_position + static_cast<int64_t>(c.tokens.size()) >
        (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", c.sequence_id, " is too long"));
    }
    total += static_cast<int64_t>(c.tokens.size());
  }
  if (total > options_.max_step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step has ", total,
        " tokens, more than max_step_tokens=", options_.max_step_tokens));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> Model::Step(const StepInput& input) {
  const absl::Time start = absl::Now();
  if (absl::Status st = Validate(input); !st.ok()) return st;

  // Reserve every cache block the step needs before touching any state.
  const int br = kv_cache_->block_rows();
  int64_t needed = 0;
  std::vector<bool> is_new(input.chunks.size());
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    is_new[i] = SequenceLength(c.sequence_id) < 0;
    const int64_t end =
        c.start_position + static_cast<int64_t>(c.tokens.size());
    for (int l = 0; l < dims_.num_layers; ++l) {
      const int r = dims_.compress_ratios[l];
      int64_t have_entries = 0;
      if (is_new[i]) {
        needed += CeilDiv(dims_.sliding_window, br);
        if (r > 0) needed += CeilDiv(2 * r, br);
      } else {
        have_entries = static_cast<int64_t>(
            sequences_.at(c.sequence_id)->layers[l].entries.size());
      }
      if (r > 0) {
        needed += std::max<int64_t>(
            CeilDiv(OwnedEntriesBefore(end / r), br) - have_entries, 0);
      }
    }
  }
  // With DCP the ranks hold different entries: they agree on refusing a
  // step if any of them cannot hold it, so that none enters the forward
  // pass alone.
  const bool fits = needed <= kv_cache_->free_blocks();
  bool all_fit = fits;
  if (options_.dcp_size > 1) {
    float misses = fits ? 0.0f : 1.0f;
    absl::StatusOr<std::unique_ptr<gpu::Buffer>> flag = Scratch(1);
    if (!flag.ok()) return flag.status();
    backend_.CopyFromHost({misses}, (*flag)->data());
    if (absl::Status st = comm_->AllReduceSum((*flag)->data(), 1); !st.ok()) {
      return st;
    }
    backend_.CopyToHost((*flag)->data(), absl::MakeSpan(&misses, 1));
    all_fit = misses == 0.0f;
  }
  if (!all_fit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache full: the step needs ", needed, " blocks on rank ",
        options_.tp_rank, ", ", kv_cache_->free_blocks(), " of ",
        kv_cache_->num_blocks(), " free",
        fits ? " (another rank of the group is full)" : ""));
  }
  std::vector<Sequence*> seqs;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    if (is_new[i]) {
      auto seq = std::make_unique<Sequence>();
      seq->layers.resize(dims_.num_layers);
      sequences_[c.sequence_id] = std::move(seq);
    }
    Sequence* seq = sequences_.at(c.sequence_id).get();
    const int64_t end =
        c.start_position + static_cast<int64_t>(c.tokens.size());
    for (int l = 0; l < dims_.num_layers; ++l) {
      Sequence::LayerState& ls = seq->layers[l];
      const int r = dims_.compress_ratios[l];
      absl::Status st;
      if (is_new[i]) {
        st.Update(kv_cache_->Allocate(
            static_cast<int>(CeilDiv(dims_.sliding_window, br)), ls.window));
        if (r > 0) {
          st.Update(kv_cache_->Allocate(static_cast<int>(CeilDiv(2 * r, br)),
                                        ls.partial));
        }
      }
      if (r > 0) {
        const int64_t more = CeilDiv(OwnedEntriesBefore(end / r), br) -
                             static_cast<int64_t>(ls.entries.size());
        if (more > 0) {
          st.Update(kv_cache_->Allocate(static_cast<int>(more), ls.entries));
        }
      }
      if (!st.ok()) return st;  // Cannot happen: reserved above.
    }
    seqs.push_back(seq);
  }

  StepOutput out;
  if (absl::Status st = Forward(input, seqs, out); !st.ok()) {
    for (const SequenceChunk& c : input.chunks) Release(c.sequence_id);
    return st;
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const std::vector<int64_t>& t = input.chunks[i].tokens;
    seqs[i]->tokens.insert(seqs[i]->tokens.end(), t.begin(), t.end());
    tokens += static_cast<int64_t>(t.size());
  }
  stats_.steps += 1;
  stats_.tokens += tokens;
  stats_.time += absl::Now() - start;
  return out;
}

absl::StatusOr<std::unique_ptr<gpu::Buffer>> Model::Scratch(int64_t floats) {
  return backend_.Allocate(std::max<int64_t>(floats, 1));
}

absl::Status Model::AllReduce(MatrixView m) {
  if (comm_ == nullptr || options_.tp_size == 1) return absl::OkStatus();
  return comm_->AllReduceSum(m.data, m.rows * m.cols);
}

// Allocates scratch buffers or returns the error from the enclosing function.
#define MNEME_SCRATCH(var, floats)                                         \
  absl::StatusOr<std::unique_ptr<gpu::Buffer>> var##_or = Scratch(floats); \
  if (!var##_or.ok()) return var##_or.status();                            \
  std::unique_ptr<gpu::Buffer> var = *std::move(var##_or)

absl::Status Model::Forward(const StepInput& input,
                            const std::vector<Sequence*>& seqs,
                            StepOutput& out) {
  const ModelDims& d = dims_;
  const int64_t D = d.hidden_size, hc = d.hc_mult;
  std::vector<int32_t> ids, positions;
  for (const SequenceChunk& c : input.chunks) {
    for (size_t j = 0; j < c.tokens.size(); ++j) {
      ids.push_back(static_cast<int32_t>(c.tokens[j]));
      positions.push_back(static_cast<int32_t>(c.start_position + j));
    }
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  out.logits.assign(input.chunks.size(), {});
  if (T == 0) return absl::OkStatus();

  MNEME_SCRATCH(emb, T * D);
  backend_.Embedding(ids, vocab_begin_, *weights_->embed, emb->view(T, D));
  if (absl::Status st = AllReduce(emb->view(T, D)); !st.ok()) return st;
  MNEME_SCRATCH(stream, T * hc * D);
  {
    std::vector<int32_t> rep(T * hc);
    for (int64_t i = 0; i < T * hc; ++i) rep[i] = static_cast<int32_t>(i / hc);
    backend_.GatherRows(emb->view(T, D), rep, stream->view(T * hc, D));
  }
  const MatrixView X = stream->view(T, hc * D);
  MNEME_SCRATCH(x, T * D);
  MNEME_SCRATCH(post, T * hc);
  MNEME_SCRATCH(comb, T * hc * hc);
  MNEME_SCRATCH(xn, T * D);

  for (int l = 0; l < d.num_layers; ++l) {
    const LayerWeights& lw = weights_->layers[l];
    if (d.IsEngramLayer(l)) {
      if (absl::Status st = EngramLayer(l, input, seqs, T, X); !st.ok()) {
        return st;
      }
    }
    for (int sub = 0; sub < 2; ++sub) {
      const bool attn = sub == 0;
      MatrixView src = X;
      if (hc > 1) {
        backend_.HcPre(X, attn ? *lw.hc_attn_fn : *lw.hc_ffn_fn,
                       (attn ? lw.hc_attn_base : lw.hc_ffn_base)->data(),
                       (attn ? lw.hc_attn_scale : lw.hc_ffn_scale)->data(),
                       static_cast<int>(hc), d.hc_sinkhorn_iters, d.hc_eps,
                       x->view(T, D), post->view(T, hc),
                       comb->view(T, hc * hc));
        src = x->view(T, D);
      }
      backend_.RmsNorm(src, (attn ? lw.attn_norm : lw.ffn_norm)->data(),
                       d.rms_norm_eps, xn->view(T, D));
      MNEME_SCRATCH(a, T * D);
      absl::Status st = attn ? Attention(l, input, seqs, positions,
                                         xn->view(T, D), a->view(T, D))
                             : Moe(l, xn->view(T, D), a->view(T, D));
      if (!st.ok()) return st;
      if (hc > 1) {
        backend_.HcPost(a->view(T, D), post->view(T, hc),
                        comb->view(T, hc * hc), static_cast<int>(hc), X);
      } else {
        backend_.Add(X, a->view(T, D), X);
      }
    }
  }
  return Head(input, X, out);
}

absl::Status Model::EngramLayer(int layer, const StepInput& input,
                                const std::vector<Sequence*>& seqs,
                                int64_t tokens, MatrixView x_stream) {
  const absl::Time start = absl::Now();
  const int n = options_.tp_size, rank = options_.tp_rank;
  const int64_t rd = engram_row_dim_;
  const std::vector<int>& mine = engram_columns_[rank];
  const int64_t ncols = static_cast<int64_t>(mine.size());
  // The rows stay bf16 (as the store sends them) until they are placed:
  // the all-gather moves half the bytes of fp32. Two bf16 values travel in
  // one float slot; a gather only copies bits.
  const int64_t per_rank = tokens * ncols * rd;  // bf16 values.
  std::vector<uint16_t> rows(static_cast<size_t>(per_rank + (per_rank & 1)));
  int64_t t0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    const std::vector<int64_t>& history = seqs[i]->tokens;
    const int64_t ctx = std::min<int64_t>(engram_context_,
                                          static_cast<int64_t>(history.size()));
    engram::v1::LookupRequest req;
    req.set_layer_id(layer);
    for (int64_t k = static_cast<int64_t>(history.size()) - ctx;
         k < static_cast<int64_t>(history.size()); ++k) {
      req.add_token_ids(history[k]);
    }
    for (int64_t t : c.tokens) req.add_token_ids(t);
    req.set_context_token_count(static_cast<int32_t>(ctx));
    for (int col : mine) req.add_columns(col);
    req.set_encoding(engram::v1::ROW_ENCODING_BF16);
    const int64_t n_tokens = static_cast<int64_t>(c.tokens.size());
    absl::StatusOr<engram::v1::LookupResponse> resp =
        n_tokens * ncols <= kMaxRowsPerLookup ? engram_->Lookup(req)
                                              : engram_->LookupStream(req);
    if (!resp.ok()) {
      return absl::Status(resp.status().code(),
                          absl::StrCat("Engram layer ", layer,
                                       " lookup: ", resp.status().message()));
    }
    const size_t want = static_cast<size_t>(n_tokens * ncols * rd * 2);
    if (resp->rows().size() != want || resp->row_dim() != rd) {
      return absl::DataLossError(absl::StrCat(
          "Engram layer ", layer, " lookup returned ", resp->rows().size(),
          " bytes of rows of ", resp->row_dim(), " values, expected ", want,
          " bytes of ", rd));
    }
    std::memcpy(rows.data() + t0 * ncols * rd, resp->rows().data(), want);
    t0 += n_tokens;
  }
  // Every rank's rows, then each token's rows in column order.
  const int64_t slots = (per_rank + 1) / 2;  // Floats per rank.
  std::vector<uint16_t> all;
  if (n > 1) {
    MNEME_SCRATCH(send, slots);
    MNEME_SCRATCH(recv, n * slots);
    backend_.CopyFromHost(
        absl::MakeConstSpan(reinterpret_cast<const float*>(rows.data()),
                            static_cast<size_t>(slots)),
        send->data());
    if (absl::Status st = comm_->AllGather(send->data(), slots, recv->data());
        !st.ok()) {
      return st;
    }
    all.resize(static_cast<size_t>(n * slots * 2));
    backend_.CopyToHost(recv->data(),
                        absl::MakeSpan(reinterpret_cast<float*>(all.data()),
                                       static_cast<size_t>(n * slots)));
  } else {
    all = std::move(rows);
  }
  const int64_t width = int64_t{engram_num_columns_} * rd;
  std::vector<float> full(static_cast<size_t>(tokens * width));
  for (int q = 0; q < n; ++q) {
    const uint16_t* block = all.data() + q * slots * 2;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < ncols; ++i) {
        const uint16_t* src = block + (t * ncols + i) * rd;
        float* dst = full.data() + t * width + engram_columns_[q][i] * rd;
        for (int64_t k = 0; k < rd; ++k) dst[k] = formats::Bf16ToFloat(src[k]);
      }
    }
  }
  stats_.engram_time += absl::Now() - start;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t D = dims_.hidden_size, hc = dims_.hc_mult;
  MNEME_SCRATCH(e, tokens * width);
  backend_.CopyFromHost(full, e->data());
  MNEME_SCRATCH(kv, tokens * (hc + 1) * D);
  backend_.Linear(e->view(tokens, width), *lw.engram_wkv,
                  kv->view(tokens, (hc + 1) * D));
  backend_.EngramGate(kv->view(tokens, (hc + 1) * D), lw.engram_q->data(),
                      lw.engram_k->data(), static_cast<int>(hc),
                      dims_.rms_norm_eps, x_stream);
  return absl::OkStatus();
}

absl::Status Model::Attention(int layer, const StepInput& input,
                              const std::vector<Sequence*>& seqs,
                              const std::vector<int32_t>& positions,
                              ConstMatrixView xn, MatrixView out) {
  const ModelDims& d = dims_;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t T = xn.rows, hd = d.head_dim;
  const int64_t hl = d.num_heads / options_.tp_size;
  const int r = d.compress_ratios[layer];
  const int W = d.sliding_window;
  const int br = kv_cache_->block_rows();
  const auto fwd = Backend::RopeDirection::kForward;

  MNEME_SCRATCH(qa, T * d.q_lora_rank);
  backend_.Linear(xn, *lw.wq_a, qa->view(T, d.q_lora_rank));
  backend_.RmsNorm(qa->view(T, d.q_lora_rank), lw.q_norm->data(),
                   d.rms_norm_eps, qa->view(T, d.q_lora_rank));
  MNEME_SCRATCH(q, T * hl * hd);
  backend_.Linear(qa->view(T, d.q_lora_rank), *lw.wq_b, q->view(T, hl * hd));
  backend_.Rope(q->view(T, hl * hd), static_cast<int>(hd), d.rope_dim,
                d.rope_theta, positions, fwd);
  MNEME_SCRATCH(kv, T * hd);
  backend_.Linear(xn, *lw.wkv, kv->view(T, hd));
  backend_.RmsNorm(kv->view(T, hd), lw.kv_norm->data(), d.rms_norm_eps,
                   kv->view(T, hd));
  backend_.Rope(kv->view(T, hd), static_cast<int>(hd), d.rope_dim, d.rope_theta,
                positions, fwd);
  std::unique_ptr<gpu::Buffer> ckv, cscore;
  if (r > 0) {
    MNEME_SCRATCH(a, T * hd);
    MNEME_SCRATCH(b, T * hd);
    backend_.Linear(xn, *lw.c_wkv, a->view(T, hd));
    backend_.Linear(xn, *lw.c_wgate, b->view(T, hd));
    ckv = std::move(a);
    cscore = std::move(b);
  }
  // With DCP every rank attends with all heads over the entries it owns and
  // the partial results are merged across ranks; otherwise each rank
  // attends with its own heads over every entry.
  const bool dcp = options_.dcp_size > 1;
  const int64_t heads = dcp ? d.num_heads : hl;
  std::unique_ptr<gpu::Buffer> q_all;
  if (dcp) {
    MNEME_SCRATCH(gathered, T * d.num_heads * hd);
    if (absl::Status st = GatherHeads(q->view(T, hl * hd), gathered->data());
        !st.ok()) {
      return st;
    }
    q_all = std::move(gathered);
  }
  const MatrixView qv = dcp ? q_all->view(T, heads * hd) : q->view(T, hl * hd);
  MNEME_SCRATCH(o_att, T * heads * hd);
  MNEME_SCRATCH(lse, T * heads);
  MNEME_SCRATCH(entry, hd);
  MNEME_SCRATCH(pool_kv, std::max(r, 1) * hd);
  MNEME_SCRATCH(pool_score, std::max(r, 1) * hd);
  const MatrixView pool = kv_cache_->pool();
  auto row_of = [br](const std::vector<int32_t>& blocks, int64_t i) {
    return static_cast<int32_t>(blocks[i / br] * br + i % br);
  };

  int64_t t0 = 0;
  for (size_t ci = 0; ci < input.chunks.size(); ++ci) {
    const SequenceChunk& c = input.chunks[ci];
    Sequence::LayerState& ls = seqs[ci]->layers[layer];
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    const int64_t p0 = c.start_position;
    int64_t n_entries = 0;  // This rank's entries after the chunk.
    if (r > 0) {
      // Feed the compressor token by token; each completed block of r
      // tokens becomes one entry (kept by the rank that owns it).
      std::vector<int32_t> kv_rows(r), score_rows(r);
      for (int j = 0; j < r; ++j) {
        kv_rows[j] = row_of(ls.partial, j);
        score_rows[j] = row_of(ls.partial, r + j);
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = p0 + j;
        const int slot = static_cast<int>(p % r);
        backend_.ScatterRows(
            ConstMatrixView(ckv->data() + (t0 + j) * hd, 1, hd),
            {kv_rows[slot]}, pool);
        backend_.ScatterRows(
            ConstMatrixView(cscore->data() + (t0 + j) * hd, 1, hd),
            {score_rows[slot]}, pool);
        if (slot != r - 1) continue;
        const int64_t e = p / r;
        if (!OwnsEntry(e)) continue;
        backend_.GatherRows(pool, kv_rows, pool_kv->view(r, hd));
        backend_.GatherRows(pool, score_rows, pool_score->view(r, hd));
        backend_.SoftmaxPool(pool_kv->view(r, hd), pool_score->view(r, hd),
                             lw.c_ape->view(r, hd), entry->view(1, hd));
        backend_.RmsNorm(entry->view(1, hd), lw.c_norm->data(), d.rms_norm_eps,
                         entry->view(1, hd));
        const int32_t entry_pos = static_cast<int32_t>(e * r);
        backend_.Rope(entry->view(1, hd), static_cast<int>(hd), d.rope_dim,
                      d.rope_theta, {entry_pos}, fwd);
        backend_.ScatterRows(entry->view(1, hd),
                             {row_of(ls.entries, OwnedEntriesBefore(e))}, pool);
      }
      n_entries = OwnedEntriesBefore((p0 + n) / r);
    }
    // Keys: this rank's compressed entries, then the window positions it
    // attends (all of them, or with DCP the ones it owns): earlier tokens
    // from the ring, this chunk's from kv.
    const int64_t first_prev = p0 - std::min<int64_t>(p0, W - 1);
    std::vector<int64_t> window_pos;
    for (int64_t p = first_prev; p < p0 + n; ++p) {
      if (!dcp || OwnsEntry(p)) window_pos.push_back(p);
    }
    const int64_t K = n_entries + static_cast<int64_t>(window_pos.size());
    MNEME_SCRATCH(keys, K * hd);
    std::vector<int32_t> pool_rows, key_index;     // From the pool.
    std::vector<int32_t> chunk_rows, chunk_index;  // From kv.
    for (int64_t e = 0; e < n_entries; ++e) {
      pool_rows.push_back(row_of(ls.entries, e));
      key_index.push_back(static_cast<int32_t>(e));
    }
    for (size_t i = 0; i < window_pos.size(); ++i) {
      const int64_t p = window_pos[i];
      const int32_t k = static_cast<int32_t>(n_entries + i);
      if (p < p0) {
        pool_rows.push_back(row_of(ls.window, p % W));
        key_index.push_back(k);
      } else {
        chunk_rows.push_back(static_cast<int32_t>(t0 + p - p0));
        chunk_index.push_back(k);
      }
    }
    // Gather into place: rows of each source, then scatter into keys.
    for (int from_pool = 0; from_pool < 2; ++from_pool) {
      const std::vector<int32_t>& src = from_pool ? pool_rows : chunk_rows;
      const std::vector<int32_t>& dst = from_pool ? key_index : chunk_index;
      if (src.empty()) continue;
      const int64_t m = static_cast<int64_t>(src.size());
      MNEME_SCRATCH(tmp, m * hd);
      backend_.GatherRows(
          from_pool ? ConstMatrixView(pool) : ConstMatrixView(kv->view(T, hd)),
          src, tmp->view(m, hd));
      backend_.ScatterRows(tmp->view(m, hd), dst, keys->view(K, hd));
    }
    std::vector<gpu::KeyRanges> ranges(n);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = p0 + j;
      if (r > 0) {
        ranges[j].end[0] =
            static_cast<int32_t>(OwnedEntriesBefore((p + 1) / r));
      }
      const int64_t lo = std::max<int64_t>(0, p - W + 1);
      ranges[j].begin[1] = static_cast<int32_t>(
          n_entries +
          (std::lower_bound(window_pos.begin(), window_pos.end(), lo) -
           window_pos.begin()));
      ranges[j].end[1] = static_cast<int32_t>(
          n_entries +
          (std::upper_bound(window_pos.begin(), window_pos.end(), p) -
           window_pos.begin()));
    }
    backend_.Attention(Rows(qv, t0, n), keys->view(K, hd),
                       static_cast<int>(heads), ranges,
                       1.0f / std::sqrt(static_cast<float>(hd)),
                       dcp ? nullptr : lw.attn_sink->data(),
                       Rows(o_att->view(T, heads * hd), t0, n),
                       Rows(lse->view(T, heads), t0, n));
    // Remember the last W tokens of the chunk in the window ring.
    std::vector<int32_t> src_rows, dst_rows;
    for (int64_t p = std::max(p0, p0 + n - W); p < p0 + n; ++p) {
      src_rows.push_back(static_cast<int32_t>(t0 + p - p0));
      dst_rows.push_back(row_of(ls.window, p % W));
    }
    MNEME_SCRATCH(tail, static_cast<int64_t>(src_rows.size()) * hd);
    const MatrixView tail_view =
        tail->view(static_cast<int64_t>(src_rows.size()), hd);
    backend_.GatherRows(kv->view(T, hd), src_rows, tail_view);
    backend_.ScatterRows(tail_view, dst_rows, pool);
    t0 += n;
  }
  std::unique_ptr<gpu::Buffer> merged;
  if (dcp) {
    MNEME_SCRATCH(mine, T * hl * hd);
    if (absl::Status st =
            MergeAttention(o_att->view(T, heads * hd), lse->view(T, heads),
                           lw.attn_sink->data(), mine->view(T, hl * hd));
        !st.ok()) {
      return st;
    }
    merged = std::move(mine);
  }
  const std::unique_ptr<gpu::Buffer>& o = dcp ? merged : o_att;
  backend_.Rope(o->view(T, hl * hd), static_cast<int>(hd), d.rope_dim,
                d.rope_theta, positions, Backend::RopeDirection::kInverse);

  // Output projection: wo_a per head group, then wo_b (partial sums).
  const int64_t gl = static_cast<int64_t>(lw.wo_a.size());
  const int64_t gw = (d.num_heads / d.o_groups) * hd;  // Inputs per group.
  const int64_t ol = d.o_lora_rank;
  MNEME_SCRATCH(oa, T * gl * ol);
  if (gl == 1) {
    backend_.Linear(o->view(T, gw), *lw.wo_a[0], oa->view(T, ol));
  } else {
    MNEME_SCRATCH(gin, T * gw);
    MNEME_SCRATCH(gout, T * ol);
    std::vector<int32_t> rows(T);
    for (int64_t g = 0; g < gl; ++g) {
      for (int64_t t = 0; t < T; ++t) {
        rows[t] = static_cast<int32_t>(t * gl + g);
      }
      backend_.GatherRows(o->view(T * gl, gw), rows, gin->view(T, gw));
      backend_.Linear(gin->view(T, gw), *lw.wo_a[g], gout->view(T, ol));
      backend_.ScatterRows(gout->view(T, ol), rows, oa->view(T * gl, ol));
    }
  }
  backend_.Linear(oa->view(T, gl * ol), *lw.wo_b, out);
  return AllReduce(out);
}

int64_t Model::KvFixedBlocksPerSequence() const {
  const int64_t br = kv_cache_->block_rows();
  int64_t blocks = 0;
  for (int r : dims_.compress_ratios) {
    blocks += CeilDiv(dims_.sliding_window, br);
    // The compressor's partial block, plus rounding of the entry blocks.
    if (r > 0)
      blocks += CeilDiv(2 * r, br) + 1 + CeilDiv(options_.dcp_interleave, br);
  }
  return blocks;
}

int64_t Model::KvBytesPerToken() const {
  double bytes = 0;
  for (int r : dims_.compress_ratios) {
    if (r > 0) bytes += dims_.head_dim * 4.0 / r;
  }
  return static_cast<int64_t>(std::ceil(bytes));
}

bool Model::OwnsEntry(int64_t index) const {
  const int n = options_.dcp_size;
  return n == 1 || (index / options_.dcp_interleave) % n == options_.tp_rank;
}

int64_t Model::OwnedEntriesBefore(int64_t count) const {
  const int n = options_.dcp_size;
  if (n == 1) return count;
  const int64_t il = options_.dcp_interleave;
  const int64_t cycle = n * il;
  const int64_t rest = count % cycle - options_.tp_rank * il;
  return (count / cycle) * il + std::clamp<int64_t>(rest, 0, il);
}

absl::Status Model::GatherHeads(ConstMatrixView q_local, float* q_all) {
  const int n = options_.tp_size;
  const int64_t T = q_local.rows, w = q_local.cols;
  MNEME_SCRATCH(recv, n * T * w);
  if (absl::Status st = comm_->AllGather(q_local.data, T * w, recv->data());
      !st.ok()) {
    return st;
  }
  // recv is [rank][token][w]; q_all is [token][rank][w].
  std::vector<int32_t> rows(n * T);
  for (int64_t t = 0; t < T; ++t) {
    for (int q = 0; q < n; ++q)
      rows[t * n + q] = static_cast<int32_t>(q * T + t);
  }
  backend_.GatherRows(recv->view(n * T, w), rows, MatrixView{q_all, n * T, w});
  return absl::OkStatus();
}

absl::Status Model::MergeAttention(ConstMatrixView out_all,
                                   ConstMatrixView lse_all, const float* sink,
                                   MatrixView out) {
  const int n = options_.tp_size, rank = options_.tp_rank;
  const int64_t T = out_all.rows, H = lse_all.cols;
  const int64_t hl = H / n, hd = out_all.cols / H;
  // Every rank's log-sum-exp per token and head -> the global one.
  MNEME_SCRATCH(lse_recv, n * T * H);
  if (absl::Status st = comm_->AllGather(lse_all.data, T * H, lse_recv->data());
      !st.ok()) {
    return st;
  }
  std::vector<float> lses(static_cast<size_t>(n * T * H));
  backend_.CopyToHost(lse_recv->data(), absl::MakeSpan(lses));
  std::vector<float> global(static_cast<size_t>(T * H));
  for (int64_t i = 0; i < T * H; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (int q = 0; q < n; ++q) m = std::max(m, lses[q * T * H + i]);
    double sum = 0;
    if (std::isfinite(m)) {
      for (int q = 0; q < n; ++q) sum += std::exp(lses[q * T * H + i] - m);
    }
    global[i] = std::isfinite(m) ? m + static_cast<float>(std::log(sum)) : m;
  }
  // This rank's share, weighted by exp(lse_rank - lse_global), laid out as
  // [owner rank][token][owner's heads] for the reduce-scatter.
  std::vector<float> part(static_cast<size_t>(T * H * hd));
  backend_.CopyToHost(out_all.data, absl::MakeSpan(part));
  std::vector<float> send(part.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float l = lses[rank * T * H + t * H + h];
      const float g = global[t * H + h];
      const float w = std::isfinite(l) ? std::exp(l - g) : 0.0f;
      const int64_t owner = h / hl, local = h % hl;
      float* dst = send.data() + ((owner * T + t) * hl + local) * hd;
      const float* src = part.data() + (t * H + h) * hd;
      for (int64_t k = 0; k < hd; ++k) dst[k] = w * src[k];
    }
  }
  MNEME_SCRATCH(send_buf, T * H * hd);
  backend_.CopyFromHost(send, send_buf->data());
  if (absl::Status st =
          comm_->ReduceScatterSum(send_buf->data(), T * hl * hd, out.data);
      !st.ok()) {
    return st;
  }
  // The sink once, with the global log-sum-exp of this rank's heads.
  std::vector<float> own(static_cast<size_t>(T * hl));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < hl; ++h)
      own[t * hl + h] = global[t * H + rank * hl + h];
  }
  MNEME_SCRATCH(own_buf, T * hl);
  backend_.CopyFromHost(own, own_buf->data());
  backend_.ApplySink(own_buf->view(T, hl), sink, out);
  return absl::OkStatus();
}

absl::Status Model::Moe(int layer, ConstMatrixView xn, MatrixView out) {
  const ModelDims& d = dims_;
  const LayerWeights& lw = weights_->layers[layer];
  const int64_t T = xn.rows, E = d.num_experts, k = d.experts_per_token;
  MNEME_SCRATCH(logits, T * E);
  backend_.Linear(xn, *lw.gate, logits->view(T, E));
  std::vector<int32_t> ids(T * k);
  std::vector<float> weights(T * k);
  backend_.MoeRoute(logits->view(T, E),
                    lw.gate_bias ? lw.gate_bias->data() : nullptr,
                    static_cast<int>(k), d.routed_scaling, absl::MakeSpan(ids),
                    absl::MakeSpan(weights));
  const int64_t local = static_cast<int64_t>(lw.experts.size());
  const int64_t first = options_.tp_rank * local;
  std::vector<std::vector<int32_t>> rows(local);
  std::vector<std::vector<float>> row_weights(local);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t e = ids[i] - first;
    if (e < 0 || e >= local) continue;
    rows[e].push_back(static_cast<int32_t>(i / k));
    row_weights[e].push_back(weights[i]);
  }
  for (int64_t e = 0; e < local; ++e) {
    if (rows[e].empty()) continue;
    const ExpertWeights& ew = lw.experts[e];
    backend_.ExpertForward(xn, rows[e], row_weights[e], *ew.w1, *ew.w2, *ew.w3,
                           d.swiglu_limit, out);
  }
  if (lw.shared.w1 != nullptr) {
    std::vector<int32_t> all(T);
    for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t);
    const std::vector<float> ones(T, 1.0f);
    backend_.ExpertForward(xn, all, ones, *lw.shared.w1, *lw.shared.w2,
                           *lw.shared.w3, d.swiglu_limit, out);
  }
  return AllReduce(out);
}

absl::Status Model::Head(const StepInput& input, ConstMatrixView x_stream,
                         StepOutput& out) {
  const ModelDims& d = dims_;
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
  MNEME_SCRATCH(xs, R * hc * D);
  backend_.GatherRows(x_stream, rows, xs->view(R, hc * D));
  MNEME_SCRATCH(xh, R * D);
  if (hc > 1) {
    backend_.HcHead(xs->view(R, hc * D), *weights_->hc_head_fn,
                    weights_->hc_head_base->data(),
                    weights_->hc_head_scale->data(), static_cast<int>(hc),
                    d.hc_eps, xh->view(R, D));
  } else {
    backend_.CopyColumns(xs->view(R, D), 0, xh->view(R, D));
  }
  backend_.RmsNorm(xh->view(R, D), weights_->norm->data(), d.rms_norm_eps,
                   xh->view(R, D));
  MNEME_SCRATCH(local, R * vocab_rows_);
  backend_.Linear(xh->view(R, D), *weights_->head, local->view(R, vocab_rows_));
  std::vector<float> logits(static_cast<size_t>(R * V));
  const int n = options_.tp_size;
  if (n == 1) {
    backend_.CopyToHost(local->data(), absl::MakeSpan(logits));
  } else {
    // Pad each rank's shard to vocab_shard_ columns, gather, unpad.
    const int64_t vs = vocab_shard_;
    std::vector<float> mine(static_cast<size_t>(R * vs), 0.0f);
    std::vector<float> shard(static_cast<size_t>(R * vocab_rows_));
    backend_.CopyToHost(local->data(), absl::MakeSpan(shard));
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(mine.data() + r * vs, shard.data() + r * vocab_rows_,
                  vocab_rows_ * sizeof(float));
    }
    MNEME_SCRATCH(send, R * vs);
    MNEME_SCRATCH(recv, n * R * vs);
    backend_.CopyFromHost(mine, send->data());
    if (absl::Status st = comm_->AllGather(send->data(), R * vs, recv->data());
        !st.ok()) {
      return st;
    }
    std::vector<float> all(static_cast<size_t>(n * R * vs));
    backend_.CopyToHost(recv->data(), absl::MakeSpan(all));
    for (int q = 0; q < n; ++q) {
      const int64_t begin = std::min<int64_t>(q * vs, V);
      const int64_t width = std::min(vs, V - begin);
      for (int64_t r = 0; r < R && width > 0; ++r) {
        std::memcpy(logits.data() + r * V + begin,
                    all.data() + (q * R + r) * vs, width * sizeof(float));
      }
    }
  }
  int64_t r0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    out.logits[i].assign(logits.begin() + r0 * V,
                         logits.begin() + (r0 + counts[i]) * V);
    r0 += counts[i];
  }
  return absl::OkStatus();
}

#undef MNEME_SCRATCH

}  // namespace mneme::model
