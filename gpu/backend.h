#ifndef MNEME_GPU_BACKEND_H_
#define MNEME_GPU_BACKEND_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "formats/exl3/exl3.h"
#include "formats/gridbook/gridbook.h"

namespace mneme::gpu {

// How a weight matrix [rows = out features, cols = in features] is stored in
// a checkpoint. Every format is row-major; packed fp4 keeps the even element
// in the low nibble.
enum class WeightFormat {
  kUnspecified = 0,
  // fp32 values.
  kF32 = 1,
  // bf16 values.
  kBf16 = 2,
  // e4m3 (fn) codes with one UE8M0 scale byte per block_rows x block_cols
  // block ([ceil(rows / block_rows), ceil(cols / block_cols)] scale bytes).
  kFp8Block = 3,
  // e2m1 codes, two per byte, with one UE8M0 scale byte per 32 consecutive
  // values of a row ([rows, cols / 32] scale bytes).
  kMxfp4 = 4,
  // e2m1 codes, two per byte, with one e4m3 scale per 16 consecutive values
  // of a row ([rows, cols / 16] scale bytes), times global_scale.
  kNvfp4 = 5,
  // EXL3 (exllamav3 trellis; formats/exl3/exl3.h): data is the trellis,
  // int16 [cols / 16, rows / 16, 16 * exl3_bits] (input features first);
  // scale is suh (fp16 [cols]) then svh (fp16 [rows]). rows and cols are
  // multiples of 128.
  kExl3 = 6,
  // GridBook codebook rungs (formats/gridbook/gridbook.h): data is
  // [rows, cols / 256 * TypeSize(scheme)] superblocks; scale is the fp32
  // per-row weight_scale [rows] for fp8 schemes, empty for fp4 (the group
  // scales are in the superblocks). cols is a multiple of 256.
  kGridbook = 7,
};

// A view of a weight's checkpoint bytes (borrowed; only read during
// Backend::UploadWeight).
struct HostWeight {
  WeightFormat format = WeightFormat::kUnspecified;
  // Output features. > 0.
  int64_t rows = 0;
  // Input features. > 0; a multiple of 32 (kMxfp4) or 16 (kNvfp4).
  int64_t cols = 0;
  // The codes: rows * cols values of the format's width.
  absl::Span<const uint8_t> data;
  // The block scales (empty for kF32 / kBf16).
  absl::Span<const uint8_t> scale;
  // kFp8Block block shape. Default: 32 x 32 (V4.1).
  int block_rows = 32;
  int block_cols = 32;
  // kNvfp4 second-level scale. Default: 1.
  float global_scale = 1.0f;
  // kExl3 bits per weight (1..8) and codebook.
  int exl3_bits = 0;
  formats::exl3::Codebook exl3_codebook = formats::exl3::Codebook::kMul1;
  // kGridbook scheme and tables. The tables are shared by every weight of a
  // config group (one sidecar entry serves a whole layer stack of experts),
  // so weights keep a reference instead of a copy each.
  formats::gridbook::Scheme gridbook_scheme = {};
  std::shared_ptr<const formats::gridbook::Codebooks> gridbook_books;
  // kGridbook fp4 schemes with the static W4A4 activation contract (and
  // kF32 slices of such weights): the target's input_global_scale (> 0,
  // finite); activations are quantized as formats/gridbook's
  // QuantizeActivationsW4A4 before the product, also by a backend that
  // dequantizes weights. 0 = weight-only. Default: 0.
  float gridbook_input_scale = 0.0f;
};

// A weight matrix resident in the backend (device memory on a GPU). Created
// by Backend::UploadWeight; immutable; used only with the backend that made
// it. Thread-safe (immutable).
class Weight {
 public:
  virtual ~Weight() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t cols() const = 0;
  virtual WeightFormat format() const = 0;
  // Backend memory it holds, bytes.
  virtual int64_t bytes() const = 0;
};

// One routed expert's SwiGLU weights (Backend::MoeExperts): w1, w3 [I, D],
// w2 [D, I]. Borrowed.
struct ExpertRef {
  const Weight* w1 = nullptr;
  const Weight* w2 = nullptr;
  const Weight* w3 = nullptr;
};

// How Backend::MoeLayer routes each token to top_k experts.
struct MoeRouting {
  int top_k = 0;
  float routed_scaling = 1.0f;
  // Routing by score (MoeRoute): the bias [E] in backend memory, or null.
  const float* bias = nullptr;
  // Hash routing (V4's first layers) when not empty: each token's listed
  // experts [T * top_k] (host; gate.tid2eid of its token id, each in [0,
  // E)). A listing's weight is its score sqrt(softplus(logit)) (computed
  // in double, rounded to fp32) over the sum of all the token's listings'
  // scores (double), times routed_scaling; an expert listed again for the same
  // token is added once, at its first listing (the official indexed write does
  // not accumulate), while every listing counts in the sum.
  absl::Span<const int32_t> hash_experts;
};

// A dense row-major fp32 matrix in backend memory (host memory for the CPU
// backend, device memory for CUDA). Borrowed views; the owner is a Buffer.
struct MatrixView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};
struct ConstMatrixView {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  ConstMatrixView() = default;
  ConstMatrixView(const float* d, int64_t r, int64_t c)
      : data(d), rows(r), cols(c) {}
  ConstMatrixView(MatrixView m)  // NOLINT: a mutable view is readable.
      : data(m.data), rows(m.rows), cols(m.cols) {}
};

// Owned backend memory of `size` floats (or int32s; see the typed views).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual int64_t size() const = 0;  // Elements (4 bytes each).
  virtual float* data() = 0;
  virtual const float* data() const = 0;
  int32_t* ints() { return reinterpret_cast<int32_t*>(data()); }
  const int32_t* ints() const {
    return reinterpret_cast<const int32_t*>(data());
  }
  MatrixView view(int64_t rows, int64_t cols) {
    return MatrixView{data(), rows, cols};
  }
};

// Host memory a caller fills and then hands to the device's ops with
// Backend::StageFromHost (a step's Engram rows land here straight from the
// store's responses). On the CUDA backend it is pinned (page-locked): the
// copy engine reads it without a bounce through a staging ring, and a GPU
// that shares the host's memory (GB10) reads it in place, with no copy.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  virtual int64_t size() const = 0;  // Floats.
  virtual float* data() = 0;         // The host's address.
};

// HostStaging in ordinary host memory (Backend's default).
class HostMemoryStaging final : public HostStaging {
 public:
  explicit HostMemoryStaging(int64_t floats)
      : values_(static_cast<size_t>(floats), 0.0f) {}
  int64_t size() const override { return static_cast<int64_t>(values_.size()); }
  float* data() override { return values_.data(); }

 private:
  std::vector<float> values_;
};

// One sequence's sampling parameters.
struct SamplingParams {
  // 0 = greedy (argmax, lowest id on ties). Otherwise logits / temperature.
  float temperature = 0.0f;
  // Keep the smallest set of most likely tokens whose probability sums to
  // >= top_p. Default 1 (off).
  float top_p = 1.0f;
  // Keep the top_k most likely tokens; 0 = off.
  int32_t top_k = 0;
  // Drop tokens with probability < min_p * max probability; 0 = off.
  float min_p = 0.0f;
  // Seed of this draw (the caller derives it per sequence and step so runs
  // are reproducible).
  uint64_t seed = 0;
};

// The numerical operations of the model, implemented per device. Every
// MatrixView / pointer argument is backend memory (Buffer-owned) unless it is
// a Span of host values. Activations are fp32, row-major, one row per token.
// Calls are synchronous from the caller's point of view on the CPU backend;
// a GPU backend may queue them on its stream, and Synchronize() waits.
//
// Shapes are the caller's contract: a mismatch is a programming error
// (CHECK), not a runtime status; anything that depends on input data (ids
// past a table, NaNs in weights at upload) returns a Status.
//
// Thread-safety: one Backend is used by one thread at a time (a worker's
// step loop); the implementation may use its own threads inside a call.
// Inverse RoPE frequencies theta^(-2i / rope_dim), i < rope_dim / 2.
inline std::vector<double> RopeInverseFrequencies(double theta, int rope_dim) {
  std::vector<double> f(rope_dim / 2);
  for (int i = 0; i < rope_dim / 2; ++i) {
    f[i] = std::pow(theta, -2.0 * i / rope_dim);
  }
  return f;
}

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0", ...
  virtual std::string name() const = 0;

  // ---- memory ------------------------------------------------------------
  // `elements` >= 0 floats, zero-filled. ResourceExhausted when out of
  // memory.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(
      int64_t elements) = 0;
  virtual void CopyFromHost(absl::Span<const float> src, float* dst) = 0;
  virtual void CopyToHost(const float* src, absl::Span<float> dst) = 0;
  // Waits for queued work (no-op on the CPU).
  virtual absl::Status Synchronize() = 0;
  // `floats` >= 0 of host staging memory (see HostStaging), zero-filled.
  // ResourceExhausted when none can be had. Default: ordinary host memory.
  virtual absl::StatusOr<std::unique_ptr<HostStaging>> AllocateHostStaging(
      int64_t floats) {
    if (floats < 0) {
      return absl::InvalidArgumentError("negative host staging size");
    }
    return std::make_unique<HostMemoryStaging>(floats);
  }
  // Makes staging floats [offset, offset + floats) readable by the ops
  // queued after AwaitStaged() and returns where those ops read them: `dst`
  // (backend memory of `floats`), which a copy beside the queued work fills
  // (a device with copy engines moves the bytes while earlier layers
  // compute; no op queued before AwaitStaged may write dst), or the staging
  // memory's own address for the device, with no copy, where the device
  // reads it in place (the CPU backend; a GPU that shares the host's
  // memory). Either way the caller leaves those floats unchanged until
  // Synchronize() returns after the ops that read them.
  virtual const float* StageFromHost(HostStaging& staging, int64_t offset,
                                     int64_t floats, float* dst) = 0;
  // Whether StageFromHost reads `staging` where it is (returning the
  // staging's own address) rather than copying it into `dst`; then dst may
  // be null. Default: false.
  virtual bool ReadsStagingInPlace(const HostStaging& staging) const {
    (void)staging;
    return false;
  }
  // Whether StageFromHost reads in place the staging AllocateHostStaging
  // gives when that gets the memory it asks for (pinned, on a GPU): a model
  // sizes its workspace by it at load, before any staging exists. Default:
  // false.
  virtual bool ReadsAllocatedStagingInPlace() const { return false; }
  // Orders every op queued from now on after the copies StageFromHost
  // started.
  virtual void AwaitStaged() {}

  // Makes a backend copy of a checkpoint weight. InvalidArgument naming the
  // problem for a bad shape / byte count / format; DataLoss for a NaN scale.
  virtual absl::StatusOr<std::unique_ptr<Weight>> UploadWeight(
      const HostWeight& weight) = 0;
  // The weight's values as fp32 on the host, row-major [rows, cols] into
  // `out` (rows * cols floats): what Linear multiplies by (for tools that
  // inspect a loaded weight; not on the serving path).
  virtual void DequantizeWeight(const Weight& weight,
                                absl::Span<float> out) = 0;

  // ---- dense ops -----------------------------------------------------------
  // y[T, w.rows] = x[T, w.cols] . w^T (fp32 accumulation). With
  // accumulate, y += instead of y =.
  enum class Accumulate { kNo = 0, kYes = 1 };
  virtual void Linear(ConstMatrixView x, const Weight& w, MatrixView y,
                      Accumulate accumulate = Accumulate::kNo) = 0;
  // y[i, :] = x[i, :] * rsqrt(mean(x[i, :]^2) + eps) * weight (weight may
  // be null: no scale; else cols floats of backend memory). y may alias x.
  virtual void RmsNorm(ConstMatrixView x, const float* weight, float eps,
                       MatrixView y) = 0;
  // Rotates, in place, the last rope_dim values of every head of x [T,
  // heads * head_dim] by positions[t] (host values): interleaved pairs (2i,
  // 2i + 1) of those values turn by angle pos * inv_freq[i] (host,
  // rope_dim / 2 values; RopeInverseFrequencies for plain RoPE);
  // kInverse turns by -angle.
  enum class RopeDirection { kForward = 0, kInverse = 1 };
  virtual void Rope(MatrixView x, int head_dim, int rope_dim,
                    absl::Span<const double> inv_freq,
                    absl::Span<const int32_t> positions,
                    RopeDirection direction) = 0;
  // y = a + b elementwise (same shapes); y may alias a or b.
  virtual void Add(ConstMatrixView a, ConstMatrixView b, MatrixView y) = 0;
  // Copies columns [src_col, src_col + y.cols) of x into y.
  virtual void CopyColumns(ConstMatrixView x, int64_t src_col,
                           MatrixView y) = 0;
  // Columns [dst_col, dst_col + x.cols) of y = x (same rows).
  virtual void PlaceColumns(ConstMatrixView x, MatrixView y,
                            int64_t dst_col) = 0;
  // y[i, :] = x[rows[i], :] (rows: host values in [0, x.rows)).
  virtual void GatherRows(ConstMatrixView x, absl::Span<const int32_t> rows,
                          MatrixView y) = 0;
  // y[:, j] = x[:, cols[j]] (cols: host values in [0, x.cols); same rows).
  virtual void GatherColumns(ConstMatrixView x, absl::Span<const int32_t> cols,
                             MatrixView y) = 0;
  // x[rows[i], :] = src[i, :] (rows: host values in [0, x.rows)).
  virtual void ScatterRows(ConstMatrixView src, absl::Span<const int32_t> rows,
                           MatrixView x) = 0;

  // ---- embedding -----------------------------------------------------------
  // y[t, :] = table[ids[t] - first_id, :] for ids in [first_id, first_id +
  // table.rows), zeros otherwise (the vocabulary shard of a TP rank; an
  // all-reduce completes it). table is kF32 or kBf16.
  virtual void Embedding(absl::Span<const int32_t> ids, int64_t first_id,
                         const Weight& table, MatrixView y) = 0;

  // ---- attention -----------------------------------------------------------
  // out *= sigmoid(lse - sink[h]) per head (see SparseAttention).
  virtual void ApplySink(ConstMatrixView lse, const float* sink,
                         MatrixView out) = 0;
  // Decode context parallelism: the weights of this rank's partial attention
  // for the reduce-scatter that merges the ranks' parts. lses [ranks, T * H]
  // is every rank's log-sum-exp per token and head (gathered); part [T, H *
  // hd] this rank's output over the entries it keeps. With g = log(sum_q
  // exp(lses[q])) per (t, h) (the maximum m first, the sum in double; -inf
  // where every rank has -inf) and w = exp(lses[rank] - g) (0 where this
  // rank's is not finite): send [ranks * T, H / ranks * hd], row q * T + t,
  // holds w * part of token t for owner q's heads [q H / ranks, (q + 1) H /
  // ranks); global_own [T, H / ranks] holds g of this rank's heads.
  virtual void WeighDcpParts(ConstMatrixView lses, ConstMatrixView part,
                             int rank, int64_t heads, MatrixView send,
                             MatrixView global_own) = 0;

  // Multi-query attention with K = V over per-query key lists (the
  // official sparse_attn): q [T, heads * head_dim], kv [K, head_dim] shared
  // by every head; for query t the keys are the rows idx[t * width + j] of
  // kv, j < width, -1 = none (host values; a row listed twice counts
  // twice). s_j = scale * q[t, h] . kv[j]; lse[t, h] = logsumexp_j s_j
  // (-inf when there is no key); out[t, h] = sum_j softmax(s)_j kv[j] (zeros
  // without keys). With sink (heads backend floats; null = none) the output
  // is then multiplied by sigmoid(lse - sink[h]) (the sink's logit added to
  // the softmax denominator); lse is always reported without the sink, so
  // partial results can be merged first (MergeAttention) and the sink
  // applied once after.
  virtual void SparseAttention(ConstMatrixView q, ConstMatrixView kv, int heads,
                               absl::Span<const int32_t> idx, int width,
                               float scale, const float* sink, MatrixView out,
                               MatrixView lse) = 0;
  // The indexer's scores for queries q [T, heads * d] with per-head weights
  // w [T, heads] against the keys in rows of `keys` (host values), each read
  // from its first d = q.cols / heads columns (keys.cols >= d), out [T, N]:
  // out[t, j] = sum_h w[t, h] * max(0, q[t, h] . keys[row(t, j), :d]), where
  // row(t, j) = rows[j] when rows.size() == N (every query the same keys),
  // else rows[t * N + j] (rows.size() == T * N: each query its own, as for
  // several sequences' decode queries together); a row -1 scores 0. The
  // keys stay where they are (the cache pool).
  virtual void IndexScores(ConstMatrixView q, ConstMatrixView w,
                           ConstMatrixView keys, absl::Span<const int32_t> rows,
                           MatrixView out) = 0;
  // The indexer's top-k of each row t of scores [T, N], chosen where the
  // scores are: the k best of row t's eligible entries - e < visible[t] and,
  // when blocks_per_row > 0, e / block_size one of row t's candidate blocks
  // (candidate_blocks [T, blocks_per_row], host, each row ascending with -1
  // padding after its blocks) - where better = the larger scores[t, e] *
  // scale (fp32; -0 and +0 equal), then the lower e, and a NaN ranks after
  // every number. Host outputs: ids [T, k], row t's chosen entries in
  // ascending order then -1; counts[t] = min(k, eligible entries of row t).
  // Only these come back. k >= 1.
  virtual void SelectTopK(ConstMatrixView scores, float scale,
                          absl::Span<const int64_t> visible, int k,
                          absl::Span<const int32_t> candidate_blocks,
                          int blocks_per_row, int block_size,
                          absl::Span<int32_t> ids,
                          absl::Span<int32_t> counts) = 0;
  // The indexer's choice and the attention over it in one call, the chosen
  // entries staying where the scores are (nothing comes back to the host):
  // query t attends the keys fixed[t * fixed_width + j] (j < fixed_width;
  // -1 = none), then entry_rows[t * N + e] for each entry e that
  // SelectTopK(scores [T, N], index_scale, visible, k, no candidate blocks)
  // chooses for row t, in that ascending order (-1 = none, as for an entry
  // this rank does not hold). N >= 1. The same as SparseAttention(q,
  // kv, heads, those lists, width fixed_width + k with -1 after each row's
  // chosen entries, scale, sink, out, lse). fixed and entry_rows: host, each
  // -1 or a row of kv.
  virtual void ChooseAndAttend(ConstMatrixView scores, float index_scale,
                               absl::Span<const int64_t> visible, int k,
                               absl::Span<const int32_t> entry_rows,
                               ConstMatrixView q, ConstMatrixView kv, int heads,
                               absl::Span<const int32_t> fixed, int fixed_width,
                               float scale, const float* sink, MatrixView out,
                               MatrixView lse) = 0;
  // V4.1's candidate blocks of each row t of scores [T, N] (the official
  // select_candidate_blocks), chosen where the scores are: block b (entries
  // [b * block_size, (b + 1) * block_size)) scores as the largest
  // scores[t, e] * scale (fp32) of its entries below visible[t] (NaN
  // ignored; -inf when there is none), the block holding entry visible[t] - 1
  // as +inf; chosen are the topk_blocks best blocks (the larger score, then
  // the lower block) of those scoring above -inf. Host outputs: blocks
  // [T, topk_blocks], row t's ascending then -1; counts[t] how many.
  // topk_blocks >= 1, block_size >= 1.
  virtual void SelectCandidateBlocks(ConstMatrixView scores, float scale,
                                     absl::Span<const int64_t> visible,
                                     int topk_blocks, int block_size,
                                     absl::Span<int32_t> blocks,
                                     absl::Span<int32_t> counts) = 0;

  // ---- compressor ----------------------------------------------------------
  // Compressed entries, each from a block of r tokens: out [E, d], kv and
  // score [E * r, d] (entry e's rows [e * r, (e + 1) * r)), ape [r, d]
  // shared by every entry; out[e, c] = sum_i softmax_i(score[e * r + i, c] +
  // ape[i, c]) * kv[e * r + i, c] (softmax over the r rows, independently
  // per column). E >= 1, r >= 1.
  virtual void SoftmaxPool(ConstMatrixView kv, ConstMatrixView score,
                           ConstMatrixView ape, MatrixView out) = 0;

  // ---- hyper-connections ---------------------------------------------------
  // After a sub-layer with output a [T, D]: x_stream[t, j] =
  // post[t, j] * a[t] + sum_i comb[t, i, j] * x_stream[t, i] (in place).
  virtual void HcPost(ConstMatrixView a, ConstMatrixView post,
                      ConstMatrixView comb, int hc, MatrixView x_stream) = 0;
  // The head's combination: mix = (x_stream[t] . fn^T) * rsqrt(mean(
  // x_stream[t]^2) + eps) with fn [hc, hc * D]; w_h = sigmoid(mix[h] *
  // scale[0] + base[h]) + eps; x [T, D] = sum_h w_h x_stream[t, h].
  virtual void HcHead(ConstMatrixView x_stream, const Weight& fn,
                      const float* base, const float* scale, int hc, float eps,
                      MatrixView x) = 0;

  // The official hc_split_sinkhorn: mix = (x_stream[t] . fn^T) *
  // rsqrt(mean(x_stream[t]^2) + norm_eps); pre_h = sigmoid(mix[h] *
  // scale[0] + base[h]) + hc_eps; post_h = 2 * sigmoid(mix[hc + h] *
  // scale[1] + base[hc + h]); comb = softmax over each row of (mix[2hc +
  // i * hc + j] * scale[2] + base[...]) + hc_eps, then the columns divided
  // by (their sum + hc_eps), then sinkhorn_iters - 1 times rows then columns
  // divided by (sum + hc_eps). Outputs pre [T, hc], post [T, hc], comb
  // [T, hc * hc] (row-major i, j).
  virtual void HcMix(ConstMatrixView x_stream, const Weight& fn,
                     const float* base, const float* scale, int hc,
                     int sinkhorn_iters, float hc_eps, float norm_eps,
                     MatrixView pre, MatrixView post, MatrixView comb) = 0;
  // x [T, D] = sum_h pre[t, h] * x_stream[t, h].
  virtual void HcCollapse(ConstMatrixView x_stream, ConstMatrixView pre, int hc,
                          MatrixView x) = 0;

  // ---- Engram --------------------------------------------------------------
  // The V4.1 Engram gate. kv [T, (hc + 1) * D]: hc keys then the shared
  // value; q_w, k_w [hc, D] (backend floats). For copy h of token t:
  // dot = sum(x_h * q_w[h] * k_w[h] * key_h) * rsqrt(mean(x_h^2) + eps) *
  //       rsqrt(mean(key_h^2) + eps) / sqrt(D);
  // gate = sigmoid(sign(dot) * sqrt(max(|dot|, 1e-6)));
  // x_stream[t, h] += gate * value (in place). x_stream [T, hc * D].
  virtual void EngramGate(ConstMatrixView kv, const float* q_w,
                          const float* k_w, int hc, float eps,
                          MatrixView x_stream) = 0;
  // Engram rows from their packed bf16 form to fp32, placed by column.
  // `packed` (backend floats) holds blocks of `block_floats` floats, one per
  // entry of `columns` / cols_per_block; block q is read as bf16 values (two
  // per float, the lower-addressed first), rows of `row_dim` values, token
  // t's cols_per_block rows in order: row (t, i) of block q becomes
  // y[t, c * row_dim .. (c + 1) * row_dim) with c = columns[q *
  // cols_per_block + i] (host). Columns no block names are left as they
  // are. Needs block_floats * 2 >= y.rows * cols_per_block * row_dim and
  // every column in [0, y.cols / row_dim).
  virtual void UnpackBf16Rows(const float* packed, int64_t block_floats,
                              absl::Span<const int32_t> columns,
                              int64_t cols_per_block, int row_dim,
                              MatrixView y) = 0;

  // ---- MoE -----------------------------------------------------------------
  // Routing: scores = sqrt(softplus(logits)) [T, E] (fp32); the top_k experts
  // of (scores + bias) are chosen (bias may be null; ties -> lower expert id
  // first; a NaN ranks after every number); their unbiased scores are
  // normalised to sum 1 and multiplied by routed_scaling. Outputs (host):
  // expert_ids [T * top_k], weights [T * top_k], in descending order of the
  // biased score.
  virtual void MoeRoute(ConstMatrixView logits, const float* bias, int top_k,
                        float routed_scaling, absl::Span<int32_t> expert_ids,
                        absl::Span<float> weights) = 0;
  // One expert's SwiGLU, several tokens: h = silu(min(x w1^T, limit)) *
  // clamp(x w3^T, -limit, limit); y[rows[i]] += weights[i] * (h w2^T)[i]
  // where x = rows `rows` of x_all (host row indices). limit <= 0: no clamp.
  // w1, w3: [I, D]; w2: [D, I].
  virtual void ExpertForward(ConstMatrixView x_all,
                             absl::Span<const int32_t> rows,
                             absl::Span<const float> weights, const Weight& w1,
                             const Weight& w2, const Weight& w3, float limit,
                             MatrixView y_all) = 0;
  // All the routed experts of one MoE layer this rank holds, in one call:
  // experts[i] is global expert first_expert + i. expert_ids and weights
  // [T * top_k] are MoeRoute's (host); assignment a (token a / top_k) goes to
  // its expert, and an id outside [first_expert, first_expert +
  // experts.size()) (another rank's expert, or -1) is skipped. The result is
  // ExpertForward of each expert in ascending order with its assignments'
  // tokens and weights in ascending order of a: the same additions into
  // y_all in the same order. Every expert has the same shapes.
  virtual void MoeExperts(ConstMatrixView x_all,
                          absl::Span<const int32_t> expert_ids,
                          absl::Span<const float> weights, int top_k,
                          int64_t first_expert,
                          absl::Span<const ExpertRef> experts, float limit,
                          MatrixView y_all) = 0;

  // A MoE layer's routing and routed experts in one call, from its gate
  // logits [T, E] (backend memory): the assignments MoeRoute (or hash
  // routing, see MoeRouting) gives, then MoeExperts with them: the same
  // additions into y_all in the same order. A backend may keep the
  // assignments in its own memory (the CUDA backend groups them on the
  // device, so nothing comes back to the host, EXL3 experts excepted). On
  // the CUDA backend the hash-routed weights may differ from the host's by
  // the last bit (the device's double exp / log1p).
  virtual void MoeLayer(ConstMatrixView x_all, ConstMatrixView logits,
                        const MoeRouting& routing, int64_t first_expert,
                        absl::Span<const ExpertRef> experts, float limit,
                        MatrixView y_all) = 0;

  // ---- sampling ------------------------------------------------------------
  // Draws one token per row of logits [T, V] with params[t]; ids[t] is the
  // token and logprobs[t] its log-probability under the unmodified
  // distribution (log_softmax of the raw logits). Host outputs.
  virtual void Sample(ConstMatrixView logits,
                      absl::Span<const SamplingParams> params,
                      absl::Span<int32_t> ids, absl::Span<float> logprobs) = 0;
  // log_softmax of each row of logits at ids[t] (teacher-forced scoring);
  // host outputs.
  virtual void LogProbs(ConstMatrixView logits, absl::Span<const int32_t> ids,
                        absl::Span<float> logprobs) = 0;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_BACKEND_H_
