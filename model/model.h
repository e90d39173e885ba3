#ifndef MNEME_MODEL_MODEL_H_
#define MNEME_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engram_store/client/engram_client.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "model/kv_cache.h"
#include "model/layers/embedding_head.h"
#include "model/layers/engram_layer.h"
#include "model/layers/layer_context.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/step_io.h"
#include "model/workspace.h"

namespace mneme::model {

struct ModelOptions {
  // Checkpoint directory (config.json, index, shards). Required.
  std::string checkpoint_dir;
  // This process's tensor-parallel rank and the group size. Default: 0 / 1.
  int tp_rank = 0;
  int tp_size = 1;
  // The paged attention-entry pool. Default: KvCacheOptions{}.
  KvCacheOptions kv_cache;
  // Decode context parallelism: 1 (off) or tp_size. With DCP the ranks
  // split the compressed attention entries (entry i lives on rank
  // (i / dcp_interleave) % dcp_size; the sliding window stays on every
  // rank), attend over their own with every head, and merge the partial
  // results by log-sum-exp. Default: 1.
  int dcp_size = 1;
  // Entries in a row on one rank before the next. Default: 1.
  int dcp_interleave = 1;
  // Most tokens one step may carry; a larger step is InvalidArgument. The
  // step workspace is sized for it at load. Default: 16384.
  int64_t max_step_tokens = 16384;
  // Positions a sequence may be rolled back by after a step (Truncate):
  // speculative decoding's drafts, in [0, 64]. The window rings and the
  // compressors' states keep that many positions more. Default: 0.
  int max_speculative_tokens = 0;
};

// Per-step timing of a model (cumulative).
struct ModelStats {
  int64_t steps = 0;
  int64_t tokens = 0;
  absl::Duration time;         // Inside Step().
  absl::Duration engram_time;  // Waiting for Engram rows.
};

// The step runner of the DeepSeek-V4.1-style model (docs/MODEL_LAYOUT.md;
// the layers are in model/layers/, one file per module of the reference) on
// one tensor-parallel rank: its share of the weights in a Backend, a paged
// attention-entry cache, per-sequence state (sliding-window ring, the
// compressor's partial window, the token history the Engram hashes need),
// the collectives of its group, and a workspace arena for the scratch of a
// step (model/workspace.h). Every rank of a group must call Step()
// with the same input; every rank returns the same logits.
//
// A Step() whose input is invalid (unknown positions, ids out of range,
// repeated sequences) changes nothing and returns InvalidArgument. The
// Engram rows of a step are looked up before its first collective, and the
// ranks agree on the outcome (one all-reduce): when the lookup failed on
// any rank (the store down, stalled, restarting), every rank returns
// Unavailable marked by StepNotRunError() (InvalidArgument when the store
// refused the tokens) and the step changes nothing. An error during the
// forward pass (a peer lost, a collective timed out) returns that error;
// the sequences of that step are then dropped (their state is gone) and
// must be started again.
//
// Thread-compatible: one step at a time.
// Unavailable with `message`, marked as a step that did not run: the
// group is intact and no sequence changed (e.g. an Engram store fault), so
// the step's requests may fail or be retried without re-forming the group.
absl::Status StepNotRunError(absl::string_view message);
// Whether `status` is marked by StepNotRunError().
bool IsStepNotRun(const absl::Status& status);

// Checks that the checkpoint in `dir` loads for tensor-parallel size
// `tp_size` without reading any tensor data: config.json (LoadModelDims,
// CheckTensorParallel) and every tensor the ranks would load, with its
// dtype, shape and slices, plus the draft layers' headers. Works on
// full-shape checkpoints whose data are holes. The first problem, naming the
// key or the tensor (NotFound for a missing one, InvalidArgument for a wrong
// dtype or shape).
absl::Status CheckCheckpointLoads(const std::string& dir, int tp_size,
                                  gpu::Backend& backend);

class Model {
 public:
  // Loads the rank's weights. `comm` is required when tp_size > 1 (its rank
  // and size must match the options) and may be null otherwise; `engram`
  // is required when the model has Engram layers. All borrowed; they must
  // outlive the model. InvalidArgument for a config that does not match
  // the tensors or a TP size that does not divide the model; NotFound for a
  // missing tensor or shard; DataLoss for corrupt files.
  static absl::StatusOr<std::unique_ptr<Model>> Create(
      const ModelOptions& options, gpu::Backend& backend,
      gpu::Communicator* comm, engram::EngramClient* engram);
  ~Model();

  const ModelDims& dims() const { return dims_; }
  int tp_rank() const { return options_.tp_rank; }
  int tp_size() const { return options_.tp_size; }
  const std::string& checkpoint_dir() const { return options_.checkpoint_dir; }
  // Backend bytes of this rank's weights.
  int64_t weight_bytes() const { return weight_bytes_; }
  // How much the process's resident memory grew while the weights loaded
  // (-1 where /proc is unreadable; less than the weights where the
  // allocator reused pages freed before): against weight_bytes().
  int64_t weight_resident_bytes() const { return weight_resident_bytes_; }
  const KvCache& kv_cache() const { return *kv_cache_; }
  // The embedding and output head (a DSpark drafter shares them) and this
  // rank's rows of the vocabulary.
  const EmbeddingHeadWeights& embedding_head() const {
    return weights_->embedding_head;
  }
  const VocabShard& vocab() const { return vocab_; }
  // Positions at the end of a chunk whose taps a step returns
  // (StepOutput::taps): sliding_window + max_speculative_tokens, so that
  // a drafter sees its window after any prefix a verify step commits.
  int64_t TapRows() const {
    return int64_t{dims_.sliding_window} + options_.max_speculative_tokens;
  }
  const ModelStats& stats() const { return stats_; }
  // Token ids the Engram layers accept, [0, engram_vocab_size()): the size
  // of the tokenizer the Engram hashing is built from (checkpoints may pad
  // vocab_size past it). The reference indexes its compressed-id table with
  // the token ids and cannot take an id past that table, so such ids must
  // be refused before a step. 0 without Engram layers.
  int64_t engram_vocab_size() const { return engram_vocab_size_; }
  const ModelOptions& options() const { return options_; }
  // KV accounting (an upper bound of what the cache holds): blocks every
  // sequence holds whatever its length, and bytes per token on the rank
  // owning the token's compressed entries.
  int64_t KvFixedBlocksPerSequence() const;
  int64_t KvBytesPerToken() const;

  // Runs the chunks as one batch.
  absl::StatusOr<StepOutput> Step(const StepInput& input);
  // Asks the engram store to stage the rows of this rank's hash columns
  // for the hinted tokens (all Engram layers). Best effort and
  // asynchronous: returns at once; a background thread sends the hints,
  // keeping only the newest batch while one is in flight, and ignores
  // errors (a later lookup reads the rows anyway). No collectives.
  void Prefetch(const std::vector<PrefetchHint>& hints);
  // Draws one token from a row of host logits [vocab] that Step returned,
  // with `params`, on the backend: {token, logprob}. The row goes to the
  // step workspace (no allocation); not during a Step.
  absl::StatusOr<std::pair<int64_t, float>> SampleToken(
      absl::Span<const float> logits, const gpu::SamplingParams& params);
  // Forgets a sequence and frees its cache blocks (no-op if unknown).
  void Release(uint64_t sequence_id);
  // Rolls a sequence back to its first `length` tokens, as if the later
  // ones had never been stepped (rejected drafts): the window rings, the
  // compressors' partial blocks and the Engram history then reflect only
  // those. Allowed down to max_speculative_tokens below the longest the
  // sequence has been; InvalidArgument past that or for an unknown
  // sequence (nothing changes). Local: every rank must roll back alike.
  absl::Status Truncate(uint64_t sequence_id, int64_t length);
  // Forgets every sequence (the group re-formed: the peers' halves of the
  // state are gone).
  void ReleaseAll();
  // Sequences with state.
  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  // Tokens the model has processed of a sequence; -1 if unknown.
  int64_t SequenceLength(uint64_t sequence_id) const;

  // Workspace floats the model set aside at load (see model/workspace.h).
  int64_t workspace_floats() const { return workspace_->capacity_floats(); }

 private:
  Model(const ModelOptions& options, ModelDims dims, gpu::Backend& backend,
        gpu::Communicator* comm, engram::EngramClient* engram);

  absl::Status Load();
  absl::Status Validate(const StepInput& input) const;
  // Takes, for every chunk, the cache blocks the step will fill (creating
  // the state of new sequences); ResourceExhausted (nothing taken) when any
  // rank of a DCP group cannot hold them.
  absl::StatusOr<std::vector<SequenceState*>> Admit(const StepInput& input);
  // Pool rows of layer `layer`'s compressor state (and its indexer's, V4).
  int64_t StateRows(int layer) const;
  int64_t IndexStateRows(int layer) const;
  // This rank's Engram rows of the step into engram_staging_, layer after
  // layer (EngramRowSlots floats each; nothing without Engram layers),
  // after the ranks agreed that every lookup succeeded; StepNotRunError (or
  // InvalidArgument) on every rank otherwise.
  absl::Status LookupEngramRows(const StepInput& input);
  absl::Status Forward(const StepInput& input,
                       const std::vector<SequenceState*>& seqs,
                       StepOutput& out);
  void PrefetchLoop();
  // Fills out.taps of the chunks that ask for them when `layer` is a DSpark
  // target layer; `stream` is the residual stream before the layer.
  void RecordTaps(const StepInput& input, int layer,
                  gpu::ConstMatrixView stream, StepOutput& out);
  LayerContext Context() const;

  const ModelOptions options_;
  const ModelDims dims_;
  gpu::Backend& backend_;
  gpu::Communicator* const comm_;
  engram::EngramClient* const engram_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<KvCache> kv_cache_;
  std::unique_ptr<Workspace> workspace_;
  int64_t weight_bytes_ = 0;
  int64_t weight_resident_bytes_ = -1;
  VocabShard vocab_;
  // Engram hash columns of every rank; empty without Engram layers.
  EngramLayout engram_layout_;
  int64_t engram_vocab_size_ = 0;
  // The host memory a step's Engram rows land in from the store and go to
  // the device from (Backend::AllocateHostStaging): pinned on a GPU, read in
  // place where the device shares the host's memory. Grown to the largest
  // step's rows; null until a step has Engram rows.
  std::unique_ptr<gpu::HostStaging> engram_staging_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<SequenceState>> sequences_;
  ModelStats stats_;
  // Prefetch hints waiting for the prefetch thread (the newest batch only).
  absl::Mutex prefetch_mu_;
  std::vector<PrefetchHint> prefetch_pending_ ABSL_GUARDED_BY(prefetch_mu_);
  bool prefetch_stop_ ABSL_GUARDED_BY(prefetch_mu_) = false;
  std::thread prefetch_thread_;
};

}  // namespace mneme::model

#endif  // MNEME_MODEL_MODEL_H_
