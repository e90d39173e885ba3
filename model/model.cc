#include "model/model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engram_store/hashing/tokenizer_vocab.h"
#include "model/layers/attention.h"
#include "model/layers/compressor.h"
#include "model/layers/hyper_connections.h"
#include "model/layers/moe.h"
#include "model/weight_loader.h"

namespace mneme::model {
namespace {

using gpu::MatrixView;

// Sequences longer than this are refused.
constexpr int64_t kMaxSequenceTokens = int64_t{1} << 30;

// Logit rows (SequenceChunk::logits) the workspace is sized for at load: a
// step asking for more grows it once (model/workspace.h).
constexpr int64_t kHeadRowsAtLoad = 1024;

// An upper bound of the workspace floats a step of `T` tokens takes, but for
// what grows with the context rather than the step (a chunk's compressed
// entries among its attention keys) and logits past kHeadRowsAtLoad rows.
// `staging_in_place`: the backend reads the Engram rows' staging where it is
// (Backend::ReadsAllocatedStagingInPlace), so no room is set aside for
// their copies.
int64_t StepWorkspaceFloats(const ModelDims& d, const ModelOptions& o,
                            const VocabShard& vocab, const EngramLayout& engram,
                            bool staging_in_place, int64_t T) {
  auto f = [](int64_t floats) { return WorkspaceFloats(floats); };
  const int64_t D = d.hidden_size, hc = d.hc_mult, hd = d.head_dim;
  const int64_t H = d.num_heads, n = o.tp_size, hl = H / n;
  const bool dcp = o.dcp_size > 1;
  const int64_t heads = dcp ? H : hl;
  // Held through the forward pass: the stream, the mixing buffers, the
  // normed input and the sub-layer output; the embedding before them.
  const int64_t base = f(T * hc * D) + f(T * D) + 2 * f(T * hc) +
                       f(T * hc * hc) + f(T * D) + f(T * D) + f(T * D) +
                       2 * f(T * hc);
  // Attention: projections, then the per-chunk keys (window only) or the
  // merge or the output projection, whichever is largest.
  const int64_t gl = d.o_groups / n, ol = d.o_lora_rank;
  const int64_t gw = (H / d.o_groups) * hd;
  int64_t r_max = 0;
  for (int r : d.compress_ratios) r_max = std::max<int64_t>(r_max, r);
  const int64_t chunk = f((d.sliding_window + T) * hd) +
                        f(std::min<int64_t>(d.sliding_window, T) * hd) + f(hd) +
                        2 * f(r_max * hd);
  const int64_t merge =
      dcp ? f(T * hl * hd) + f(n * T * H) + f(T * H * hd) + f(T * hl) : 0;
  const int64_t out_proj = f(T * gl * ol) + f(T * gw) + f(T * ol);
  // The compressors' projections (overlapping: twice as wide) and the
  // indexer's queries and weights.
  const int64_t nI = dcp ? d.index_heads : d.index_heads / n;
  const int64_t compress =
      4 * f(T * 2 * hd) + 2 * f(T * nI * d.index_head_dim) + 2 * f(T * nI);
  // A compressor's work in the step (before the attention): its passes
  // over the step's entries and its state writes, the widest at any ratio,
  // taken with overlap and entries as wide as the cache (a bound for both
  // compressors).
  int64_t compressor_pass = 0;
  for (int r : d.compress_ratios) {
    if (r <= 0) continue;
    compressor_pass =
        std::max(compressor_pass,
                 CompressorStepWorkspaceFloats(r, /*overlap=*/true, hd, hd, T));
  }
  // The decode queries' indexer choice: their queries and weights gathered,
  // or (V4) their keys gathered for their window slots, or their queries,
  // attention and log-sum-exps gathered when they attend their choice right
  // away (the scores grow with the context).
  const int64_t choose =
      std::max({f(T * nI * d.index_head_dim) + f(T * nI), f(T * hd),
                2 * f(T * heads * hd) + f(T * heads)});
  const int64_t attention =
      f(T * d.q_lora_rank) + f(T * hl * hd) + f(T * hd) + compress +
      (dcp ? f(T * H * hd) + f(T * H * hd) : 0) + f(T * heads * hd) +
      f(T * heads) +
      std::max({chunk, merge, out_proj, compressor_pass, choose});
  const int64_t moe = f(T * d.num_experts);
  // Engram: every layer's staged rows through the pass, then a layer's
  // gathered rows, their fp32 form and projection.
  int64_t engram_staged = 0;
  int64_t engram_floats = 0;
  if (!engram.columns.empty()) {
    const int64_t ncols =
        static_cast<int64_t>(engram.columns[o.tp_rank].size());
    const int64_t slots = (T * ncols * engram.row_dim + 1) / 2;
    const int64_t width = int64_t{engram.num_columns} * engram.row_dim;
    if (!staging_in_place) {
      engram_staged = static_cast<int64_t>(d.engram_layers.size()) * f(slots);
    }
    engram_floats =
        (n > 1 ? f(n * slots) : 0) + f(T * width) + f(T * (hc + 1) * D);
  }
  const int64_t R = std::min(T, kHeadRowsAtLoad);
  // Head: the rows, their collapse and logits, and with TP the shard, its
  // padded copy, the gathered shards and a column buffer.
  const int64_t head =
      f(R * hc * D) + f(R * hc) + f(R * D) + f(R * d.vocab_size) +
      (n > 1
           ? f(R * vocab.rows) + 2 * f(R * vocab.shard) + f(n * R * vocab.shard)
           : 0);
  return f(1) + engram_staged + base +
         std::max({attention, moe, engram_floats, head});
}

// The payload that marks a step that did not run (StepNotRunError).
constexpr absl::string_view kStepNotRunPayload = "type.mneme.dev/step_not_run";

// Whether an Engram store error refuses the step's tokens (the same on
// every retry) rather than being a fault of the store.
bool IsRefusedLookup(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
         status.code() == absl::StatusCode::kOutOfRange;
}

void FreeLayerState(KvCache& cache, SequenceState::LayerState& l) {
  cache.Free(l.window);
  cache.Free(l.entries);
  cache.Free(l.index_keys);
  cache.Free(l.state);
  cache.Free(l.index_state);
}

}  // namespace

absl::Status StepNotRunError(absl::string_view message) {
  absl::Status st = absl::UnavailableError(message);
  st.SetPayload(kStepNotRunPayload, absl::Cord("1"));
  return st;
}

bool IsStepNotRun(const absl::Status& status) {
  return status.GetPayload(kStepNotRunPayload).has_value();
}

Model::Model(const ModelOptions& options, ModelDims dims, gpu::Backend& backend,
             gpu::Communicator* comm, engram::EngramClient* engram)
    : options_(options),
      dims_(std::move(dims)),
      backend_(backend),
      comm_(comm),
      engram_(engram) {}

Model::~Model() {
  if (prefetch_thread_.joinable()) {
    {
      absl::MutexLock lock(&prefetch_mu_);
      prefetch_stop_ = true;
    }
    prefetch_thread_.join();
  }
  for (auto& [id, seq] : sequences_) {
    for (SequenceState::LayerState& l : seq->layers) {
      FreeLayerState(*kv_cache_, l);
    }
  }
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(
    const ModelOptions& options, gpu::Backend& backend, gpu::Communicator* comm,
    engram::EngramClient* engram) {
  if (options.tp_size < 1 || options.tp_rank < 0 ||
      options.tp_rank >= options.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_rank=", options.tp_rank,
                     " must be in [0, tp_size=", options.tp_size, ")"));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<checkpoint::ModelConfig> config,
      checkpoint::ModelConfig::Create(options.checkpoint_dir + "/config.json"));
  ASSIGN_OR_RETURN(ModelDims dims, LoadModelDims(*config));
  RETURN_IF_ERROR(CheckTensorParallel(dims, options.tp_size));
  if (options.dcp_size != 1 && options.dcp_size != options.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dcp_size=", options.dcp_size,
                     " must be 1 or the tp_size (", options.tp_size,
                     "): decode context parallelism runs on the "
                     "tensor-parallel ranks"));
  }
  if (options.max_speculative_tokens < 0 ||
      options.max_speculative_tokens > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_speculative_tokens=", options.max_speculative_tokens,
                     " must be in [0, 64]"));
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
      new Model(options, std::move(dims), backend, comm, engram));
  if (!model->dims_.engram_layers.empty()) {
    if (engram == nullptr) {
      return absl::InvalidArgumentError(
          "the model has Engram layers but no Engram client was given");
    }
    ASSIGN_OR_RETURN(model->engram_layout_,
                     MakeEngramLayout(*config, options.tp_size));
    // The Engram hashing maps the ids of this tokenizer (ENGRAM.md, "Row id
    // computation" 1), as the engram store does.
    ASSIGN_OR_RETURN(std::unique_ptr<engram::TokenizerVocab> tokenizer,
                     engram::TokenizerVocab::Create(options.checkpoint_dir +
                                                    "/tokenizer.json"));
    model->engram_vocab_size_ = tokenizer->size();
  }
  // What loading the weights made resident (before the KV cache and the
  // workspace, which are touched when allocated).
  const absl::StatusOr<int64_t> before = ResidentBytes();
  RETURN_IF_ERROR(model->Load());
  if (const absl::StatusOr<int64_t> after = ResidentBytes();
      before.ok() && after.ok()) {
    model->weight_resident_bytes_ = *after - *before;
  }
  ASSIGN_OR_RETURN(
      model->kv_cache_,
      KvCache::Create(options.kv_cache, model->dims_.head_dim, backend));
  ASSIGN_OR_RETURN(
      model->workspace_,
      Workspace::Create(
          backend,
          StepWorkspaceFloats(model->dims_, options, model->vocab_,
                              model->engram_layout_,
                              backend.ReadsAllocatedStagingInPlace(),
                              std::max<int64_t>(options.max_step_tokens, 1))));
  return model;
}

absl::Status Model::Load() {
  ASSIGN_OR_RETURN(
      std::unique_ptr<checkpoint::ShardedCheckpoint> ckpt,
      checkpoint::ShardedCheckpoint::Create(options_.checkpoint_dir));
  WeightLoader load(*ckpt, backend_, dims_.fp8_block_rows, dims_.fp8_block_cols,
                    ckpt->dir());
  ASSIGN_OR_RETURN(const std::unique_ptr<checkpoint::GridbookArtifact> gridbook,
                   checkpoint::GridbookArtifact::Open(ckpt->dir()));
  load.set_gridbook(gridbook.get());
  ASSIGN_OR_RETURN(vocab_, ShardVocabulary(dims_.vocab_size, options_.tp_rank,
                                           options_.tp_size));
  ASSIGN_OR_RETURN(weights_,
                   LoadModelWeights(load, dims_, vocab_, engram_layout_,
                                    options_.tp_rank, options_.tp_size));
  weight_bytes_ = load.uploaded_bytes();
  for (LayerWeights& lw : weights_->layers) {
    if (lw.attn.compressor != nullptr) {
      lw.attn.compressor->SetRollbackTokens(options_.max_speculative_tokens);
    }
    if (lw.attn.indexer != nullptr && lw.attn.indexer->compressor != nullptr) {
      lw.attn.indexer->compressor->SetRollbackTokens(
          options_.max_speculative_tokens);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointLoads(const std::string& dir, int tp_size,
                                  gpu::Backend& backend) {
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ModelConfig> config,
                   checkpoint::ModelConfig::Create(dir + "/config.json"));
  ASSIGN_OR_RETURN(ModelDims dims, LoadModelDims(*config));
  RETURN_IF_ERROR(CheckTensorParallel(dims, tp_size));
  EngramLayout engram;
  if (!dims.engram_layers.empty()) {
    ASSIGN_OR_RETURN(engram, MakeEngramLayout(*config, tp_size));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardedCheckpoint> ckpt,
                   checkpoint::ShardedCheckpoint::Create(dir));
  ASSIGN_OR_RETURN(const std::unique_ptr<checkpoint::GridbookArtifact> gridbook,
                   checkpoint::GridbookArtifact::Open(ckpt->dir()));
  // The first and the last rank cover every slice's bounds.
  for (const int rank : {0, tp_size - 1}) {
    WeightLoader load(*ckpt, backend, dims.fp8_block_rows, dims.fp8_block_cols,
                      ckpt->dir());
    load.set_gridbook(gridbook.get());
    load.set_headers_only(true);
    ASSIGN_OR_RETURN(VocabShard vocab,
                     ShardVocabulary(dims.vocab_size, rank, tp_size));
    RETURN_IF_ERROR(
        LoadModelWeights(load, dims, vocab, engram, rank, tp_size).status());
  }
  return absl::OkStatus();
}

LayerContext Model::Context() const {
  return LayerContext{
      .dims = dims_,
      .backend = backend_,
      .workspace = *workspace_,
      .tp_rank = options_.tp_rank,
      .tp_size = options_.tp_size,
      .comm = comm_,
      .dcp = DcpLayout{.rank = options_.tp_rank,
                       .size = options_.dcp_size,
                       .interleave = options_.dcp_interleave},
      .rollback_tokens = options_.max_speculative_tokens,
  };
}

int64_t Model::SequenceLength(uint64_t sequence_id) const {
  auto it = sequences_.find(sequence_id);
  return it == sequences_.end()
             ? -1
             : static_cast<int64_t>(it->second->tokens.size());
}

void Model::Prefetch(const std::vector<PrefetchHint>& hints) {
  if (engram_ == nullptr || dims_.engram_layers.empty() || hints.empty()) {
    return;
  }
  absl::MutexLock lock(&prefetch_mu_);
  // Hints of an older step that were not sent yet are stale: replace them.
  prefetch_pending_ = hints;
  if (!prefetch_thread_.joinable()) {
    prefetch_thread_ = std::thread([this] { PrefetchLoop(); });
  }
}

void Model::PrefetchLoop() {
  for (;;) {
    std::vector<PrefetchHint> hints;
    {
      absl::MutexLock lock(&prefetch_mu_);
      prefetch_mu_.Await(absl::Condition(
          +[](Model* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->prefetch_mu_) {
            return m->prefetch_stop_ || !m->prefetch_pending_.empty();
          },
          this));
      if (prefetch_stop_) return;
      hints.swap(prefetch_pending_);
    }
    EngramPrefetch(engram_layout_, *engram_, dims_.engram_layers,
                   options_.tp_rank, hints);
  }
}

void Model::Release(uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return;
  for (SequenceState::LayerState& l : it->second->layers) {
    FreeLayerState(*kv_cache_, l);
  }
  sequences_.erase(it);
}

absl::StatusOr<std::pair<int64_t, float>> Model::SampleToken(
    absl::Span<const float> logits, const gpu::SamplingParams& params) {
  const auto vocab = static_cast<int64_t>(logits.size());
  if (vocab == 0) return absl::InvalidArgumentError("empty logits row");
  Workspace::Scope scope(*workspace_);
  ASSIGN_OR_RETURN(WorkBuffer row, workspace_->Take(vocab));
  backend_.CopyFromHost(logits, row.data());
  int32_t id = 0;
  float logprob = 0;
  backend_.Sample(row.view(1, vocab), {params}, absl::MakeSpan(&id, 1),
                  absl::MakeSpan(&logprob, 1));
  return std::make_pair(int64_t{id}, logprob);
}

absl::Status Model::Truncate(uint64_t sequence_id, int64_t length) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", sequence_id, " is not known"));
  }
  SequenceState& seq = *it->second;
  const int64_t now = static_cast<int64_t>(seq.tokens.size());
  const int64_t floor = seq.high_water - options_.max_speculative_tokens;
  if (length > now || length < std::max<int64_t>(floor, 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", sequence_id, " of ", now, " tokens (at most ",
        seq.high_water, ") cannot be rolled back to ", length,
        ": max_speculative_tokens is ", options_.max_speculative_tokens));
  }
  seq.tokens.resize(length);
  return absl::OkStatus();
}

void Model::ReleaseAll() {
  std::vector<uint64_t> ids;
  ids.reserve(sequences_.size());
  for (const auto& entry : sequences_) ids.push_back(entry.first);
  for (const uint64_t id : ids) Release(id);
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
      if (engram_vocab_size_ > 0 && c.tokens[t] >= engram_vocab_size_) {
        // Padding ids past the tokenizer have no compressed id.
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", c.sequence_id, ": token ", c.tokens[t], " at index ",
            t, " is outside the tokenizer's vocabulary [0, ",
            engram_vocab_size_, ") that the Engram layers map"));
      }
    }
    const gpu::SamplingParams& p = c.sampling;
    if (c.sample && (!(p.temperature >= 0 && p.temperature <= 1e4) ||
                     !(p.top_p >= 0 && p.top_p <= 1) || p.top_k < 0 ||
                     !(p.min_p >= 0 && p.min_p <= 1))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", c.sequence_id,
          ": sampling needs temperature in [0, 1e4], top_p and min_p in "
          "[0, 1], top_k >= 0"));
    }
    const int64_t have = std::max<int64_t>(SequenceLength(c.sequence_id), 0);
    if (c.start_position != have) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", c.sequence_id, " starts at position ", c.start_position,
          " but the worker holds ", have, " of its tokens"));
    }
    if (c.start_position + static_cast<int64_t>(c.tokens.size()) >
        kMaxSequenceTokens) {
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

int64_t Model::StateRows(int layer) const {
  const LayerWeights& lw = weights_->layers[layer];
  int64_t rows = 0;
  if (lw.attn.compressor != nullptr) rows += lw.attn.compressor->StateRows();
  return rows;
}

int64_t Model::IndexStateRows(int layer) const {
  const LayerWeights& lw = weights_->layers[layer];
  if (lw.attn.indexer == nullptr || lw.attn.indexer->compressor == nullptr) {
    return 0;
  }
  return lw.attn.indexer->compressor->StateRows();
}

absl::StatusOr<std::vector<SequenceState*>> Model::Admit(
    const StepInput& input) {
  const DcpLayout dcp = Context().dcp;
  // Reserve every cache block the step needs before touching any state.
  const int br = kv_cache_->block_rows();
  // Blocks a sequence's layer needs (beyond `have`) after `end` tokens.
  auto more = [&](int64_t rows, const std::vector<int32_t>& have) {
    return std::max<int64_t>(
        CeilDiv(rows, br) - static_cast<int64_t>(have.size()), 0);
  };
  static const SequenceState::LayerState kEmpty;
  int64_t needed = 0;
  std::vector<bool> is_new(input.chunks.size());
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    is_new[i] = SequenceLength(c.sequence_id) < 0;
    const int64_t end =
        c.start_position + static_cast<int64_t>(c.tokens.size());
    for (int l = 0; l < dims_.num_layers; ++l) {
      const SequenceState::LayerState& ls =
          is_new[i] ? kEmpty : sequences_.at(c.sequence_id)->layers[l];
      needed += more(Context().WindowRing(), ls.window);
      needed += more(StateRows(l), ls.state);
      needed += more(IndexStateRows(l), ls.index_state);
      if (dims_.HasCompressor(l)) {
        const int64_t own =
            dcp.OwnedEntriesBefore(end / dims_.compress_ratios[l]);
        needed += more(own, ls.entries);
        if (dims_.OwnsIndexKeys(l)) needed += more(own, ls.index_keys);
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
    Workspace::Scope scope(*workspace_);
    ASSIGN_OR_RETURN(WorkBuffer flag, workspace_->Take(1));
    backend_.CopyFromHost({misses}, flag.data());
    RETURN_IF_ERROR(comm_->AllReduceSum(flag.data(), 1));
    backend_.CopyToHost(flag.data(), absl::MakeSpan(&misses, 1));
    all_fit = misses == 0.0f;
  }
  if (!all_fit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache full: the step needs ", needed, " blocks on rank ",
        options_.tp_rank, ", ", kv_cache_->free_blocks(), " of ",
        kv_cache_->num_blocks(), " free",
        fits ? " (another rank of the group is full)" : ""));
  }
  std::vector<SequenceState*> seqs;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    if (is_new[i]) {
      auto seq = std::make_unique<SequenceState>();
      seq->layers.resize(dims_.num_layers);
      sequences_[c.sequence_id] = std::move(seq);
    }
    SequenceState* seq = sequences_.at(c.sequence_id).get();
    const int64_t end =
        c.start_position + static_cast<int64_t>(c.tokens.size());
    for (int l = 0; l < dims_.num_layers; ++l) {
      SequenceState::LayerState& ls = seq->layers[l];
      absl::Status st;
      auto grow = [&](int64_t rows, std::vector<int32_t>& blocks) {
        const int64_t m = more(rows, blocks);
        if (m > 0) st.Update(kv_cache_->Allocate(static_cast<int>(m), blocks));
      };
      grow(Context().WindowRing(), ls.window);
      grow(StateRows(l), ls.state);
      grow(IndexStateRows(l), ls.index_state);
      if (dims_.HasCompressor(l)) {
        const int64_t own =
            dcp.OwnedEntriesBefore(end / dims_.compress_ratios[l]);
        grow(own, ls.entries);
        if (dims_.OwnsIndexKeys(l)) grow(own, ls.index_keys);
      }
      RETURN_IF_ERROR(st);  // Cannot happen: reserved above.
    }
    seqs.push_back(seq);
  }
  return seqs;
}

absl::StatusOr<StepOutput> Model::Step(const StepInput& input) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(Validate(input));
  RETURN_IF_ERROR(LookupEngramRows(input));
  ASSIGN_OR_RETURN(std::vector<SequenceState*> seqs, Admit(input));
  StepOutput out;
  if (absl::Status st = Forward(input, seqs, out); !st.ok()) {
    for (const SequenceChunk& c : input.chunks) Release(c.sequence_id);
    return st;
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const std::vector<int64_t>& t = input.chunks[i].tokens;
    seqs[i]->tokens.insert(seqs[i]->tokens.end(), t.begin(), t.end());
    seqs[i]->high_water = std::max(
        seqs[i]->high_water, static_cast<int64_t>(seqs[i]->tokens.size()));
    tokens += static_cast<int64_t>(t.size());
  }
  stats_.steps += 1;
  stats_.tokens += tokens;
  stats_.time += absl::Now() - start;
  return out;
}

absl::Status Model::LookupEngramRows(const StepInput& input) {
  const int layers = static_cast<int>(dims_.engram_layers.size());
  if (layers == 0 || input.chunks.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  static const std::vector<int64_t> kNoHistory;
  std::vector<const std::vector<int64_t>*> histories;
  int64_t tokens = 0;
  for (const SequenceChunk& c : input.chunks) {
    auto it = sequences_.find(c.sequence_id);
    histories.push_back(it == sequences_.end() ? &kNoHistory
                                               : &it->second->tokens);
    tokens += static_cast<int64_t>(c.tokens.size());
  }
  // The rows land in the host staging memory the device reads them from,
  // once the device is done with the last step's.
  const int64_t slots =
      EngramRowSlots(engram_layout_, options_.tp_rank, tokens);
  RETURN_IF_ERROR(backend_.Synchronize());
  absl::Status failed;
  if (engram_staging_ == nullptr || engram_staging_->size() < layers * slots) {
    // Whole powers of two: a few sizes however the steps' tokens vary
    // (pinned memory is slow to allocate), at most twice the largest step's.
    engram_staging_.reset();
    absl::StatusOr<std::unique_ptr<gpu::HostStaging>> staging =
        backend_.AllocateHostStaging(static_cast<int64_t>(std::bit_ceil(
            static_cast<uint64_t>(std::max<int64_t>(1, layers * slots)))));
    if (staging.ok()) {
      engram_staging_ = *std::move(staging);
    } else {
      failed = staging.status();
    }
  }
  for (int e = 0; e < layers && failed.ok(); ++e) {
    failed = EngramLookup(
        engram_layout_, *engram_, dims_.engram_layers[e], options_.tp_rank,
        input, histories,
        absl::MakeSpan(
            reinterpret_cast<uint16_t*>(engram_staging_->data() + e * slots),
            static_cast<size_t>(2 * slots)));
  }
  stats_.engram_time += absl::Now() - start;
  // Every rank learns whether any lookup failed, and whether the store
  // refused the tokens, before the first collective of the layers: a rank
  // that skipped the step would leave its peers waiting in a collective.
  float flags[2] = {failed.ok() ? 0.0f : 1.0f,
                    IsRefusedLookup(failed) ? 1.0f : 0.0f};
  if (options_.tp_size > 1) {
    Workspace::Scope scope(*workspace_);
    ASSIGN_OR_RETURN(WorkBuffer flag, workspace_->Take(2));
    backend_.CopyFromHost(flags, flag.data());
    RETURN_IF_ERROR(comm_->AllReduceSum(flag.data(), 2));
    backend_.CopyToHost(flag.data(), absl::MakeSpan(flags, 2));
  }
  if (flags[0] == 0.0f) return absl::OkStatus();
  const std::string what =
      failed.ok() ? std::string("another rank's Engram lookup failed")
                  : std::string(failed.message());
  if (flags[1] > 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Engram store refused the step's tokens: ", what));
  }
  return StepNotRunError(absl::StrCat(
      "the step did not run, an Engram lookup failed (", what, ")"));
}

absl::Status Model::Forward(const StepInput& input,
                            const std::vector<SequenceState*>& seqs,
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
  out.taps.assign(input.chunks.size(), {});
  out.sampled.assign(input.chunks.size(), {});
  if (T == 0) return absl::OkStatus();
  const LayerContext ctx = Context();
  const StepBatch batch{input, seqs, positions};
  Workspace& ws = *workspace_;
  Workspace::Scope scope(ws);
  // Staged copies land before the workspace is handed out again, however
  // the pass ends (declared after the scope: runs before it ends).
  const absl::Cleanup await_staged = [this] { backend_.AwaitStaged(); };

  // Every Engram layer's rows start towards the device before the first
  // layer, so the copies overlap the layers before them.
  std::vector<const float*> staged_rows;
  if (!d.engram_layers.empty()) {
    ASSIGN_OR_RETURN(staged_rows,
                     StageEngramRows(ctx, engram_layout_, T,
                                     static_cast<int>(d.engram_layers.size()),
                                     *engram_staging_));
  }
  ASSIGN_OR_RETURN(WorkBuffer stream, ws.Take(T * hc * D));
  const MatrixView X = stream.view(T, hc * D);
  RETURN_IF_ERROR(Embed(ctx, weights_->embedding_head, vocab_, ids, X));
  ASSIGN_OR_RETURN(HcScratch hc_scratch, TakeHcScratch(ws, T, d));
  ASSIGN_OR_RETURN(WorkBuffer xn, ws.Take(T * D));
  // V4.1's staggered mixing: the pre mix each sub-layer collapses with
  // (layer 0: copy 0), and this layer's attention mix for its FFN.
  ASSIGN_OR_RETURN(WorkBuffer carry, ws.TakeZeroed(T * hc));
  ASSIGN_OR_RETURN(WorkBuffer attn_pre, ws.Take(T * hc));
  if (d.IsV41()) {
    std::vector<float> one_hot(T * hc, 0.0f);
    for (int64_t t = 0; t < T; ++t) one_hot[t * hc] = 1.0f;
    backend_.CopyFromHost(one_hot, carry.data());
  }
  StepSelections selections;

  for (int l = 0; l < d.num_layers; ++l) {
    const LayerWeights& lw = weights_->layers[l];
    if (lw.engram != nullptr) {
      const size_t e = static_cast<size_t>(
          std::find(d.engram_layers.begin(), d.engram_layers.end(), l) -
          d.engram_layers.begin());
      if (e >= staged_rows.size()) {
        return absl::InternalError(
            absl::StrCat("no Engram rows for layer ", l));
      }
      RETURN_IF_ERROR(EngramForward(ctx, engram_layout_, *lw.engram,
                                    staged_rows[e], X, stats_.engram_time));
    }
    RecordTaps(input, l, X, out);
    // Attention, then the MoE, each between its hyper-connection mixing.
    {
      Workspace::Scope sublayer(ws);
      HcMix(ctx, lw.hc_attn, X, hc_scratch);
      MatrixView src;
      if (d.IsV41()) {
        src = HcCollapse(ctx, X, carry.view(T, hc), hc_scratch);
        backend_.CopyColumns(hc_scratch.pre.view(T, hc), 0,
                             attn_pre.view(T, hc));
      } else {
        src = HcCollapse(ctx, X, hc_scratch.pre.view(T, hc), hc_scratch);
      }
      backend_.RmsNorm(src, lw.attn_norm->data(), d.rms_norm_eps,
                       xn.view(T, D));
      ASSIGN_OR_RETURN(WorkBuffer a, ws.Take(T * D));
      RETURN_IF_ERROR(AttentionForward(ctx, lw.attn, l, *kv_cache_, batch,
                                       selections, xn.view(T, D),
                                       a.view(T, D)));
      HcPost(ctx, a.view(T, D), hc_scratch, X);
    }
    {
      Workspace::Scope sublayer(ws);
      HcMix(ctx, lw.hc_ffn, X, hc_scratch);
      MatrixView src;
      if (d.IsV41()) {
        src = HcCollapse(ctx, X, attn_pre.view(T, hc), hc_scratch);
        backend_.CopyColumns(hc_scratch.pre.view(T, hc), 0, carry.view(T, hc));
      } else {
        src = HcCollapse(ctx, X, hc_scratch.pre.view(T, hc), hc_scratch);
      }
      backend_.RmsNorm(src, lw.ffn_norm->data(), d.rms_norm_eps, xn.view(T, D));
      ASSIGN_OR_RETURN(WorkBuffer a, ws.TakeZeroed(T * D));
      RETURN_IF_ERROR(
          MoeForward(ctx, lw.ffn, ids, xn.view(T, D), a.view(T, D)));
      HcPost(ctx, a.view(T, D), hc_scratch, X);
    }
  }
  return Head(ctx, weights_->embedding_head, vocab_, input, X,
              carry.view(T, hc), out);
}

void Model::RecordTaps(const StepInput& input, int layer,
                       gpu::ConstMatrixView stream, StepOutput& out) {
  const std::vector<int>& targets = dims_.dspark_target_layers;
  const auto it = std::find(targets.begin(), targets.end(), layer);
  if (it == targets.end()) return;
  const int64_t k = it - targets.begin();
  const int64_t L = static_cast<int64_t>(targets.size());
  const int64_t D = dims_.hidden_size, hc = dims_.hc_mult;
  std::vector<float> rows;
  int64_t t0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const int64_t chunk = static_cast<int64_t>(input.chunks[i].tokens.size());
    if (input.chunks[i].taps) {
      // The chunk's last TapRows() positions.
      const int64_t n = std::min(chunk, TapRows());
      const int64_t from = t0 + chunk - n;
      std::vector<float>& taps = out.taps[i];
      taps.resize(static_cast<size_t>(n * L * D));
      rows.resize(static_cast<size_t>(n * hc * D));
      backend_.CopyToHost(stream.data + from * hc * D, absl::MakeSpan(rows));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t c = 0; c < D; ++c) {
          double sum = 0;
          for (int64_t j = 0; j < hc; ++j) sum += rows[(t * hc + j) * D + c];
          taps[(t * L + k) * D + c] = static_cast<float>(sum / hc);
        }
      }
    }
    t0 += chunk;
  }
}

int64_t Model::KvFixedBlocksPerSequence() const {
  const int64_t br = kv_cache_->block_rows();
  int64_t blocks = 0;
  for (int l = 0; l < dims_.num_layers; ++l) {
    blocks += CeilDiv(Context().WindowRing(), br) + CeilDiv(StateRows(l), br) +
              CeilDiv(IndexStateRows(l), br);
    // Rounding of the entry blocks.
    if (dims_.HasCompressor(l)) {
      const int64_t runs = dims_.OwnsIndexKeys(l) ? 2 : 1;
      blocks += runs * (1 + CeilDiv(options_.dcp_interleave, br));
    }
  }
  return blocks;
}

int64_t Model::KvBytesPerToken() const {
  // Every compressed entry and index key takes a pool row.
  double bytes = 0;
  for (int l = 0; l < dims_.num_layers; ++l) {
    if (!dims_.HasCompressor(l)) continue;
    const double rows = dims_.OwnsIndexKeys(l) ? 2.0 : 1.0;
    bytes += rows * dims_.head_dim * 4.0 / dims_.compress_ratios[l];
  }
  return static_cast<int64_t>(std::ceil(bytes));
}

}  // namespace mneme::model
