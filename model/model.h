#ifndef MNEME_MODEL_MODEL_H_
#define MNEME_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engram_store/client/engram_client.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "model/kv_cache.h"
#include "model/model_config.h"

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
  // Most tokens one step may carry (scratch memory grows with it).
  // Default: 16384.
  int64_t max_step_tokens = 16384;
};

// Tokens of one sequence in one step: a prefill chunk or a decode token.
struct SequenceChunk {
  // The caller's id of the sequence. A sequence the model has not seen
  // starts at position 0.
  uint64_t sequence_id = 0;
  // Token ids, >= 1 of them, each in [0, vocab_size).
  std::vector<int64_t> tokens;
  // Position of tokens[0]: the number of tokens of the sequence the model
  // has already processed (0 for a new sequence).
  int64_t start_position = 0;
  // Which logits the step returns for this chunk.
  enum class Logits { kNone = 0, kLast = 1, kAll = 2 };
  Logits logits = Logits::kLast;
};

// Tokens whose Engram rows a later step will need.
struct PrefetchHint {
  // Up to the n-gram lookback of tokens preceding `tokens`, oldest first.
  std::vector<int64_t> context;
  std::vector<int64_t> tokens;
};

struct StepInput {
  // At most one chunk per sequence.
  std::vector<SequenceChunk> chunks;
};

struct StepOutput {
  // Per chunk, in input order: fp32 logits [rows, vocab_size] of the
  // requested positions (none, the last, or every token of the chunk).
  std::vector<std::vector<float>> logits;
};

// Per-step timing of a model (cumulative).
struct ModelStats {
  int64_t steps = 0;
  int64_t tokens = 0;
  absl::Duration time;         // Inside Step().
  absl::Duration engram_time;  // Waiting for Engram rows.
};

// The DeepSeek-V4.1-style model (docs/MODEL_LAYOUT.md) on one
// tensor-parallel rank: its share of the weights in a Backend, a paged
// attention-entry cache, per-sequence state (sliding-window ring, the
// compressor's partial window, the token history the Engram hashes need),
// and the collectives of its group. Every rank of a group must call Step()
// with the same input; every rank returns the same logits.
//
// A Step() whose input is invalid (unknown positions, ids out of range,
// repeated sequences) changes nothing and returns InvalidArgument. An
// error during the forward pass (a peer lost, the Engram store failing, the
// cache full) returns that error; the sequences of that step are then
// dropped (their state is gone) and must be started again.
//
// Thread-compatible: one step at a time.
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
  const KvCache& kv_cache() const { return *kv_cache_; }
  const ModelStats& stats() const { return stats_; }
  const ModelOptions& options() const { return options_; }
  // KV accounting (an upper bound of what the cache holds): blocks every
  // sequence holds whatever its length, and bytes per token on the rank
  // owning the token's compressed entries.
  int64_t KvFixedBlocksPerSequence() const;
  int64_t KvBytesPerToken() const;

  // Runs the chunks as one batch.
  absl::StatusOr<StepOutput> Step(const StepInput& input);
  // Asks the engram store to stage the rows of this rank's hash columns
  // for the hinted tokens (all Engram layers). Best effort: the store
  // queues the reads and drops them when its queue is full; errors are
  // ignored (a later lookup reads the rows anyway). No collectives.
  void Prefetch(const std::vector<PrefetchHint>& hints);
  // Forgets a sequence and frees its cache blocks (no-op if unknown).
  void Release(uint64_t sequence_id);
  // Sequences with state.
  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  // Tokens the model has processed of a sequence; -1 if unknown.
  int64_t SequenceLength(uint64_t sequence_id) const;

  struct Weights;
  struct Sequence;

 private:
  Model(const ModelOptions& options, ModelDims dims, gpu::Backend& backend,
        gpu::Communicator* comm, engram::EngramClient* engram);

  absl::Status Load();
  absl::Status Validate(const StepInput& input) const;
  absl::StatusOr<Sequence*> Admit(const SequenceChunk& chunk);
  absl::Status Forward(const StepInput& input,
                       const std::vector<Sequence*>& seqs, StepOutput& out);
  absl::Status EngramLayer(int layer, const StepInput& input,
                           const std::vector<Sequence*>& seqs, int64_t tokens,
                           gpu::MatrixView x_stream);
  absl::Status Attention(int layer, const StepInput& input,
                         const std::vector<Sequence*>& seqs,
                         const std::vector<int32_t>& positions,
                         gpu::ConstMatrixView xn, gpu::MatrixView out);
  absl::Status Moe(int layer, gpu::ConstMatrixView xn, gpu::MatrixView out);
  absl::Status Head(const StepInput& input, gpu::ConstMatrixView x_stream,
                    StepOutput& out);
  absl::StatusOr<std::unique_ptr<gpu::Buffer>> Scratch(int64_t floats);
  // DCP: whether this rank keeps compressed entry `index`; how many of the
  // entries [0, count) it keeps.
  bool OwnsEntry(int64_t index) const;
  int64_t OwnedEntriesBefore(int64_t count) const;
  // DCP: every rank's query heads [T, H * hd] from this rank's [T, hl * hd].
  absl::Status GatherHeads(gpu::ConstMatrixView q_local, float* q_all);
  // DCP: merges every rank's (out, lse) over all heads into this rank's
  // heads of the attention output, with the sink applied once.
  absl::Status MergeAttention(gpu::ConstMatrixView out_all,
                              gpu::ConstMatrixView lse_all, const float* sink,
                              gpu::MatrixView out);
  absl::Status AllReduce(gpu::MatrixView m);

  const ModelOptions options_;
  const ModelDims dims_;
  gpu::Backend& backend_;
  gpu::Communicator* const comm_;
  engram::EngramClient* const engram_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<KvCache> kv_cache_;
  int64_t weight_bytes_ = 0;
  // This rank's vocabulary shard [vocab_begin_, vocab_begin_ + vocab_rows_)
  // of vocab_shard_ rows per rank.
  int64_t vocab_shard_ = 0;
  int64_t vocab_begin_ = 0;
  int64_t vocab_rows_ = 0;
  // Engram hash columns of every rank (strided split), and this rank's.
  std::vector<std::vector<int>> engram_columns_;
  int engram_num_columns_ = 0;
  int engram_row_dim_ = 0;
  int engram_context_ = 0;  // Tokens of n-gram history (max order - 1).
  absl::flat_hash_map<uint64_t, std::unique_ptr<Sequence>> sequences_;
  ModelStats stats_;
};

}  // namespace mneme::model

#endif  // MNEME_MODEL_MODEL_H_
