#ifndef MNEME_MODEL_LAYERS_COMPRESSOR_H_
#define MNEME_MODEL_LAYERS_COMPRESSOR_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "model/kv_cache.h"
#include "model/layers/layer_context.h"
#include "model/weight_loader.h"

namespace mneme::model {

// The official Compressor: every `ratio` tokens become one compressed entry,
// a per-channel softmax pool of their projections wkv(x) weighted by
// wgate(x) (+ the position bias ape[t mod ratio] where the release has
// one), then RMSNorm. Variants:
//  - V4, ratio 4 ("overlap"): wkv / wgate are [2 dim, D]; an entry pools 8
//    slots per channel, the previous block's tokens at the first half of the
//    channels and this block's at the second half (the previous slots are
//    empty for block 0).
//  - V4, other ratios, and V4.1 ratios > 1: wkv / wgate [dim, D], the block's
//    own tokens.
//  - V4.1 ratio 1: no gate, the entry is norm(wkv(x)).
// The caller rotates and stores the entries.
struct CompressorWeights {
  int ratio = 0;
  bool overlap = false;
  int64_t dim = 0;
  std::unique_ptr<gpu::Weight> wkv, wgate;  // wgate null for ratio 1.
  std::unique_ptr<gpu::Buffer> ape;         // [ratio, c * dim] or null.
  std::unique_ptr<gpu::Buffer> norm;

  // Blocks of `ratio` tokens the per-sequence state holds (the incomplete
  // block, the previous one with overlap, and room for positions that are
  // written and then rolled back); see SetRollbackTokens. Default: the
  // minimum.
  int state_blocks = 0;

  // Projection width per token: 2 dim with overlap, else dim.
  int64_t width() const { return overlap ? 2 * dim : dim; }
  // Blocks of the state: position p lives in slot p % (StateBlocks() *
  // ratio).
  int64_t StateBlocks() const {
    return std::max<int64_t>(state_blocks, overlap ? 2 : 1);
  }
  // Sizes the state so that a sequence may be rolled back by up to
  // `tokens` positions: the positions an entry still needs (the incomplete
  // block and, with overlap, the previous one) are never the slots of
  // positions up to `tokens` past the last committed one.
  void SetRollbackTokens(int tokens) {
    const int64_t live = overlap ? 2 * ratio - 1 : ratio - 1;
    state_blocks = static_cast<int>((tokens + live + ratio - 1) / ratio);
  }
  // Pool rows (KvCache rows of at least `dim` floats) of the per-sequence
  // state: the tokens of the incomplete block (and with overlap the
  // previous block), projections and scores.
  int64_t StateRows() const;
};

// Loads `prefix` ("layers.<l>.attn.compressor.") wkv, wgate (ratio > 1),
// ape (with_ape), norm.weight.
absl::StatusOr<CompressorWeights> LoadCompressorWeights(
    WeightLoader& load, const std::string& prefix, const ModelDims& dims,
    int ratio, int64_t dim, bool overlap, bool with_ape);

// The projections of xn [T, D] at `positions`: kv = wkv(xn) and score =
// wgate(xn) + ape[position mod ratio], [T, width()] each (score untouched
// for ratio 1).
absl::Status CompressorProject(const LayerContext& ctx,
                               const CompressorWeights& w,
                               gpu::ConstMatrixView xn,
                               absl::Span<const int32_t> positions,
                               gpu::MatrixView kv, gpu::MatrixView score);

// An entry a step's chunk completed: the chunk's index in the step and the
// entry's index in its sequence.
struct CompletedEntry {
  int32_t chunk = 0;
  int64_t entry = 0;
};

// Receives completed entries (each chunk's in ascending order) and their
// rows, normalised, [entries.size(), dim] (before RoPE).
using EntrySink = std::function<absl::Status(
    absl::Span<const CompletedEntry> entries, gpu::MatrixView rows)>;

// One compressor's work in a step: the step's chunks (of distinct
// sequences) are added in turn, then Finish pools every wanted entry they
// complete together - a few backend calls a pass of up to ~4,096 pooled rows,
// whatever the number of chunks and their lengths - hands them to the sink,
// and writes to each sequence's state the chunk's last tokens it keeps. The
// entries' tokens come from the step's rows, and from the state for the
// tokens before a chunk (read before any state is written).
class CompressorStep {
 public:
  // kv and score: the step's projections [T, w.width()]. All borrowed until
  // Finish returns.
  CompressorStep(const LayerContext& ctx, const CompressorWeights& w,
                 KvCache& cache, gpu::ConstMatrixView kv,
                 gpu::ConstMatrixView score);

  // Chunk `chunk` of the step: rows [t0, t0 + n) of kv and score, positions
  // [p0, p0 + n); `state` is its sequence's state pool rows (StateRows() of
  // them, borrowed until Finish returns). The entries it completes that
  // want(e) are pooled.
  void Add(int32_t chunk, const std::vector<int32_t>& state, int64_t t0,
           int64_t p0, int64_t n, const std::function<bool(int64_t)>& want);

  // Pools the added chunks' entries and hands them to `sink` (one call a
  // pass; none when there are none), then writes the states. Call once.
  absl::Status Finish(const EntrySink& sink);

 private:
  struct Chunk {
    const std::vector<int32_t>* state = nullptr;
    int64_t t0 = 0, p0 = 0;
  };
  // A wanted entry: block `block` of chunk `chunk` (for ratio 1, the token
  // at that position).
  struct Job {
    int32_t chunk = 0;
    int64_t block = 0;
  };
  absl::Status FinishRatioOne(const EntrySink& sink);
  absl::Status Pool(const EntrySink& sink);
  absl::Status WriteStates();
  // The state's pool row of half h of the token in `slot` of `chunk`'s
  // sequence, kind 0 the projections, 1 the scores.
  int32_t StateRow(const Chunk& chunk, int kind, int64_t slot,
                   int64_t half) const;

  const LayerContext& ctx_;
  const CompressorWeights& w_;
  KvCache& cache_;
  gpu::ConstMatrixView src_[2];  // kv, score.
  std::vector<Chunk> chunks_;    // By the step's chunk index (gaps unused).
  std::vector<Job> jobs_;
  // Per kind: rows of the step's token halves (row t * c + h is half h of
  // token t) and the state pool rows they go to.
  std::vector<int32_t> state_src_[2];
  std::vector<int32_t> state_dst_[2];
};

// An upper bound of the workspace floats a CompressorStep's Finish takes,
// its sink included when the sink takes at most 2 k pool rows' floats for
// k entries (the attention's: a copy for the index keys and one widened to
// the pool), for a step of n tokens at `ratio` with entries of `dim` <=
// pool_cols floats.
int64_t CompressorStepWorkspaceFloats(int ratio, bool overlap, int64_t dim,
                                      int64_t pool_cols, int64_t n);

// Writes rows [k, d] (d <= pool.cols) to the pool rows `dst` (k of them),
// the columns past d zero.
absl::Status WritePoolRows(const LayerContext& ctx, gpu::MatrixView pool,
                           gpu::ConstMatrixView rows,
                           absl::Span<const int32_t> dst);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_COMPRESSOR_H_
