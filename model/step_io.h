#ifndef MNEME_MODEL_STEP_IO_H_
#define MNEME_MODEL_STEP_IO_H_

#include <cstdint>
#include <vector>

#include "gpu/backend.h"

namespace mneme::model {

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
  // Whether the step returns the chunk's taps (StepOutput::taps): what a
  // DSpark drafter reads of the target.
  bool taps = false;
  // Whether the step draws the token after the chunk from its last
  // position's logits with `sampling` (StepOutput::sampled). The draw is
  // made where the logits are (Backend::Sample): with `logits` kNone the
  // row is not returned, and only the token and its log-probability come
  // back from the device.
  bool sample = false;
  gpu::SamplingParams sampling;
};

// A token the step drew (SequenceChunk::sample) and its log-probability
// under the unmodified distribution.
struct SampledToken {
  int64_t id = -1;
  float logprob = 0.0f;
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
  // Per chunk, in input order, for chunks with `taps`: fp32 [rows,
  // dspark_target_layers.size() * hidden_size] for the chunk's last rows =
  // min(tokens, Model::TapRows()) positions: each one's attention input of
  // every DSpark target layer (the residual stream before the block, after
  // its Engram module, averaged over the hyper-connection copies), target
  // layers in config order; empty for the other chunks.
  std::vector<std::vector<float>> taps;
  // Per chunk, in input order: the drawn token of chunks with `sample`
  // (id -1 for the others).
  std::vector<SampledToken> sampled;
};

// What the model keeps of one sequence between steps: the tokens it has
// processed (the Engram hashes need the history) and, per layer, the cache
// blocks of its attention state (model/kv_cache.h).
struct SequenceState {
  std::vector<int64_t> tokens;
  // The most tokens the sequence has had (a rollback does not lower it).
  int64_t high_water = 0;
  struct LayerState {
    std::vector<int32_t> window;       // Ring of sliding_window rows.
    std::vector<int32_t> entries;      // Compressed entries, in order.
    std::vector<int32_t> index_keys;   // Their index keys, in order.
    std::vector<int32_t> state;        // The compressor's incomplete block.
    std::vector<int32_t> index_state;  // The indexer compressor's (V4).
  };
  std::vector<LayerState> layers;
};

// One step as the layers see it: the input and, per chunk, its sequence's
// state (before the step: `tokens` does not yet hold the chunk).
struct StepBatch {
  const StepInput& input;
  const std::vector<SequenceState*>& seqs;
  // Per token of the step, chunk after chunk: its position.
  const std::vector<int32_t>& positions;
};

}  // namespace mneme::model

#endif  // MNEME_MODEL_STEP_IO_H_
