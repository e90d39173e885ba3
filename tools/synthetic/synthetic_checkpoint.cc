#include "tools/synthetic/synthetic_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/engram_table.h"
#include "checkpoint/safetensors_writer.h"
#include "common/file_io.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/primes.h"
#include "formats/bf16.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/ue8m0.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic {
namespace {

namespace fs = std::filesystem;
using formats::RowFormat;

constexpr int kMaxNgramSize = 4;
constexpr int kHeads = 8;
constexpr int kColumns = (kMaxNgramSize - 1) * kHeads;
// hc_eps of the full model's config.json.
constexpr double kHcEps = 1e-6;
// Rows generated per task.
constexpr int64_t kRowsPerTask = 4096;

// splitmix64: a well-mixed 64-bit stream from any seed.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

uint64_t RowSeed(uint64_t seed, int layer, int64_t row) {
  SplitMix mix(seed ^ (static_cast<uint64_t>(layer) << 56));
  return mix.Next() ^ (static_cast<uint64_t>(row) * 0xD1B54A32D192ED03ULL);
}

std::string ShardName(int index, int count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  return mneme::WriteFileAtomically(path, text);
}

// The options only kFullModel uses.
absl::Status ValidateFullModel(const SyntheticCheckpointOptions& o) {
  if (!o.expert_layer_ids.empty()) {
    return absl::InvalidArgumentError(
        "expert_layer_ids must be empty with contents kFullModel (every "
        "layer has routed experts)");
  }
  if (o.draft_stages != 0) {
    return absl::InvalidArgumentError(
        "draft_stages must be 0 with contents kFullModel");
  }
  if (o.o_groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("o_groups=", o.o_groups, " must be >= 1"));
  }
  if (o.num_attention_heads < 1 || o.num_attention_heads % o.o_groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_attention_heads=", o.num_attention_heads,
                     " must be a positive multiple of o_groups=", o.o_groups));
  }
  if (o.qk_rope_head_dim < 2 || o.qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("qk_rope_head_dim=", o.qk_rope_head_dim,
                     " must be even and >= 2 (RoPE rotates pairs)"));
  }
  if (o.head_dim < o.qk_rope_head_dim || o.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim=", o.head_dim,
        " must be even and >= qk_rope_head_dim=", o.qk_rope_head_dim));
  }
  if (o.q_lora_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_lora_rank=", o.q_lora_rank, " must be >= 1"));
  }
  if (o.o_lora_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("o_lora_rank=", o.o_lora_rank, " must be >= 1"));
  }
  if (o.sliding_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sliding_window=", o.sliding_window, " must be >= 1"));
  }
  if (static_cast<int64_t>(o.compress_ratios.size()) != o.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("compress_ratios has ", o.compress_ratios.size(),
                     " entries; it needs one per layer (num_hidden_layers=",
                     o.num_hidden_layers, ")"));
  }
  for (size_t i = 0; i < o.compress_ratios.size(); ++i) {
    if (o.compress_ratios[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compress_ratios[", i, "]=", o.compress_ratios[i], " must be >= 0"));
    }
  }
  if (o.num_experts_per_tok < 1 ||
      o.num_experts_per_tok > o.num_routed_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_experts_per_tok=", o.num_experts_per_tok,
        " must be in [1, num_routed_experts=", o.num_routed_experts, "]"));
  }
  if (o.n_shared_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_shared_experts=", o.n_shared_experts, " must be >= 0"));
  }
  if (!std::isfinite(o.routed_scaling_factor) || o.routed_scaling_factor <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("routed_scaling_factor=", o.routed_scaling_factor,
                     " must be finite and > 0"));
  }
  if (!std::isfinite(o.swiglu_limit) || o.swiglu_limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "swiglu_limit=", o.swiglu_limit, " must be finite and >= 0"));
  }
  if (!std::isfinite(o.rope_theta) || o.rope_theta <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_theta=", o.rope_theta, " must be finite and > 0"));
  }
  if (o.hc_sinkhorn_iters < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hc_sinkhorn_iters=", o.hc_sinkhorn_iters, " must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const SyntheticCheckpointOptions& o) {
  if (o.out_dir.empty()) {
    return absl::InvalidArgumentError("--out is required");
  }
  if (o.engram_format != RowFormat::kFp8 &&
      o.engram_format != RowFormat::kNvfp4) {
    return absl::InvalidArgumentError("engram_format must be fp8 or nvfp4");
  }
  if (o.engram_vocab_size < 100 || o.engram_vocab_size >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_vocab_size=", o.engram_vocab_size, " must be in [100, 2^31)"));
  }
  if (o.engram_layer_ids.empty()) {
    return absl::InvalidArgumentError("engram_layer_ids must not be empty");
  }
  for (size_t i = 0; i < o.engram_layer_ids.size(); ++i) {
    const int id = o.engram_layer_ids[i];
    if (id < 0 || id >= o.num_hidden_layers ||
        (i > 0 && id <= o.engram_layer_ids[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "engram_layer_ids must ascend within [0, num_hidden_layers=",
          o.num_hidden_layers, ")"));
    }
  }
  if (o.hidden_size <= 0 || o.hidden_size % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden_size=", o.hidden_size, " must be a positive multiple of 32"));
  }
  if (o.hc_mult < 1) return absl::InvalidArgumentError("hc_mult must be >= 1");
  if (o.threads < 0) return absl::InvalidArgumentError("threads must be >= 0");
  for (size_t i = 0; i < o.expert_layer_ids.size(); ++i) {
    const int id = o.expert_layer_ids[i];
    if (id < 0 || id >= o.num_hidden_layers ||
        (i > 0 && id <= o.expert_layer_ids[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert_layer_ids must ascend within [0, num_hidden_layers=",
          o.num_hidden_layers, ")"));
    }
  }
  if (o.draft_stages < 0) {
    return absl::InvalidArgumentError("draft_stages must be >= 0");
  }
  if (o.num_routed_experts < 1) {
    return absl::InvalidArgumentError("num_routed_experts must be >= 1");
  }
  if (o.moe_intermediate_size <= 0 || o.moe_intermediate_size % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe_intermediate_size=", o.moe_intermediate_size,
                     " must be a positive multiple of 32"));
  }
  if (o.wkv_kind != WkvKind::kIndependent &&
      o.wkv_kind != WkvKind::kCorrelated) {
    return absl::InvalidArgumentError("unknown wkv_kind");
  }
  switch (o.contents) {
    case Contents::kEngramOnly:
      return absl::OkStatus();
    case Contents::kFullModel:
      return ValidateFullModel(o);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "contents=", static_cast<int>(o.contents), " is not a Contents value"));
}

// Encodes rows [first, first + count) of one table into `weights`/`scales`.
absl::Status EncodeRows(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, float global_scale, int64_t first,
                        int64_t count, uint8_t* weights, uint8_t* scales) {
  const RowFormat format = o.engram_format;
  const size_t wb = formats::RowWeightBytes(format);
  const size_t sb = formats::RowScaleBytes(format);
  std::vector<float> values(formats::kRowDim);
  std::vector<uint8_t> fp8(formats::RowBytes(RowFormat::kFp8));
  const formats::RowDecodeOptions fp8_decode{.format = RowFormat::kFp8};
  (void)layer_index;
  for (int64_t i = 0; i < count; ++i) {
    SyntheticRowValues(o.seed, layer, first + i, absl::MakeSpan(values));
    absl::Span<uint8_t> w(weights + i * wb, wb);
    absl::Span<uint8_t> s(scales + i * sb, sb);
    if (format == RowFormat::kFp8) {
      if (absl::Status st = formats::EncodeFp8Row(values, w, s); !st.ok()) {
        return st;
      }
      continue;
    }
    // NVFP4 tables are made from the FP8 table, as the real variant is.
    if (absl::Status st = formats::EncodeFp8Row(values, absl::MakeSpan(fp8));
        !st.ok()) {
      return st;
    }
    if (absl::Status st =
            formats::DecodeRowsF32(fp8_decode, fp8, absl::MakeSpan(values));
        !st.ok()) {
      return st;
    }
    if (absl::Status st = formats::EncodeNvfp4Row(values, global_scale, w, s);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTable(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, int64_t rows, float global_scale,
                        checkpoint::SafetensorsWriter& writer) {
  const size_t wb = formats::RowWeightBytes(o.engram_format);
  const size_t sb = formats::RowScaleBytes(o.engram_format);
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1u, std::thread::hardware_concurrency());
  const int64_t batch_rows = kRowsPerTask * threads;
  std::vector<uint8_t> weights(batch_rows * wb);
  std::vector<uint8_t> scales(batch_rows * sb);
  const std::string weight_name = checkpoint::EngramWeightTensorName(layer);
  const std::string scale_name = checkpoint::EngramScaleTensorName(layer);
  const absl::Time start = absl::Now();
  absl::Time last_report = start;
  for (int64_t first = 0; first < rows; first += batch_rows) {
    const int64_t count = std::min(batch_rows, rows - first);
    std::vector<absl::Status> results(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      const int64_t begin = t * kRowsPerTask;
      if (begin >= count) break;
      const int64_t n = std::min(kRowsPerTask, count - begin);
      pool.emplace_back([&, t, begin, n] {
        results[t] =
            EncodeRows(o, layer, layer_index, global_scale, first + begin, n,
                       weights.data() + begin * wb, scales.data() + begin * sb);
      });
    }
    for (std::thread& t : pool) t.join();
    for (const absl::Status& st : results) {
      if (!st.ok()) return st;
    }
    if (absl::Status st = writer.Append(
            weight_name, absl::MakeConstSpan(weights.data(), count * wb));
        !st.ok()) {
      return st;
    }
    if (absl::Status st = writer.Append(
            scale_name, absl::MakeConstSpan(scales.data(), count * sb));
        !st.ok()) {
      return st;
    }
    if (rows > o.progress_min_rows &&
        absl::Now() - last_report > absl::Seconds(2)) {
      last_report = absl::Now();
      const double done = static_cast<double>(first + count);
      const double secs = absl::ToDoubleSeconds(last_report - start);
      std::fprintf(stderr, "\rlayer %d: %.0f / %lld rows (%.0f rows/s)", layer,
                   done, static_cast<long long>(rows), done / secs);
    }
  }
  if (rows > o.progress_min_rows) std::fprintf(stderr, "\n");
  return absl::OkStatus();
}

// wkv.weight: FP8 e4m3 [5 * hidden, 6144] with UE8M0 scales per 32 x 32.
absl::Status WriteWkv(const SyntheticCheckpointOptions& o, int layer,
                      int64_t out_dim, checkpoint::SafetensorsWriter& writer) {
  const int64_t in_dim = int64_t{kColumns} * formats::kRowDim;
  SplitMix mix(RowSeed(o.seed, layer, -1));
  std::vector<uint8_t> row(in_dim);
  const std::string prefix = absl::StrCat("layers.", layer, ".engram.wkv.");
  for (int64_t r = 0; r < out_dim; ++r) {
    for (int64_t c = 0; c < in_dim; ++c) {
      // Roughly N(0, 1)-sized e4m3 codes: sum of uniforms.
      const float v =
          (mix.Uniform() + mix.Uniform() + mix.Uniform() - 1.5f) * 2.0f;
      row[c] = formats::FloatToE4m3(v);
    }
    if (absl::Status st = writer.Append(prefix + "weight", row); !st.ok()) {
      return st;
    }
  }
  // Scale 2^-7 (code 120) with some spread, so wkv x has unit-ish outputs.
  std::vector<uint8_t> scales((out_dim / 32) * (in_dim / 32));
  for (uint8_t& s : scales) s = static_cast<uint8_t>(118 + (mix.Next() % 4));
  return writer.Append(prefix + "scale", scales);
}

// Side of the square blocks that share one UE8M0 scale in FP8 matrices.
constexpr int64_t kFp8Block = 32;

// Encodes the row-major fp32 matrix `values` of `cols` columns (rows =
// values.size() / cols) to e4m3 `codes` (same size), with one UE8M0 scale
// per 32 x 32 block (the last block row / column may be partial) from the
// block's amax: the smallest 2^k with amax / 2^k <= 448. Appends the scales
// to `scales`, row-major over the blocks.
void EncodeFp8Blocks(absl::Span<const float> values, int64_t cols,
                     absl::Span<uint8_t> codes, std::vector<uint8_t>& scales) {
  const int64_t rows = static_cast<int64_t>(values.size()) / cols;
  for (int64_t first_row = 0; first_row < rows; first_row += kFp8Block) {
    const int64_t row_end = std::min(rows, first_row + kFp8Block);
    for (int64_t first_col = 0; first_col < cols; first_col += kFp8Block) {
      const int64_t col_end = std::min(cols, first_col + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = first_row; r < row_end; ++r) {
        for (int64_t c = first_col; c < col_end; ++c) {
          amax = std::max(amax, std::fabs(values[r * cols + c]));
        }
      }
      const uint8_t e = formats::FloatToUe8m0(amax / formats::kE4m3Max);
      scales.push_back(e);
      // 2^-(e - 127) exactly.
      const float inverse =
          formats::Ue8m0ToFloat(static_cast<uint8_t>(254 - e));
      for (int64_t r = first_row; r < row_end; ++r) {
        for (int64_t c = first_col; c < col_end; ++c) {
          codes[r * cols + c] =
              formats::FloatToE4m3(values[r * cols + c] * inverse);
        }
      }
    }
  }
}

// wkv.weight with correlated inputs (WkvKind::kCorrelated): bands of 32
// rows are generated in fp32, then encoded with one UE8M0 scale per 32 x 32
// block from the block's amax.
absl::Status WriteCorrelatedWkv(const SyntheticCheckpointOptions& o, int layer,
                                int64_t out_dim,
                                checkpoint::SafetensorsWriter& writer) {
  constexpr float kRho = 0.5f;
  const float innovation = std::sqrt(1.0f - kRho * kRho);
  const int64_t in_dim = int64_t{kColumns} * formats::kRowDim;
  SplitMix mix(RowSeed(o.seed, layer, -4));
  // Per-input scale in [0.5, 2), fixed for the layer.
  std::vector<float> input_scale(in_dim);
  for (float& s : input_scale) s = 0.5f + 1.5f * mix.Uniform();
  const std::string prefix = absl::StrCat("layers.", layer, ".engram.wkv.");
  std::vector<uint8_t> scales;
  std::vector<float> band;
  std::vector<uint8_t> codes;
  for (int64_t first = 0; first < out_dim; first += kFp8Block) {
    const int64_t rows = std::min(kFp8Block, out_dim - first);
    band.assign(rows * in_dim, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float a = 0.0f;
      for (int64_t c = 0; c < in_dim; ++c) {
        const float z =
            (mix.Uniform() + mix.Uniform() + mix.Uniform() - 1.5f) * 2.0f;
        a = c % formats::kRowDim == 0 ? z : kRho * a + innovation * z;
        band[r * in_dim + c] = input_scale[c] * a;
      }
    }
    codes.resize(rows * in_dim);
    EncodeFp8Blocks(band, in_dim, absl::MakeSpan(codes), scales);
    if (absl::Status st = writer.Append(prefix + "weight", codes); !st.ok()) {
      return st;
    }
  }
  return writer.Append(prefix + "scale", scales);
}

// Names of the tensors of routed expert `expert` of `prefix` (e.g.
// "layers.2" or "mtp.0"), weight w (1..3).
std::string ExpertTensorName(const std::string& prefix, int expert, int w,
                             const char* suffix) {
  return absl::StrCat(prefix, ".ffn.experts.", expert, ".w", w, ".", suffix);
}

// Declarations of the MXFP4 routed experts of `prefix`.
void AddExpertDecls(const SyntheticCheckpointOptions& o,
                    const std::string& prefix,
                    std::vector<checkpoint::TensorDecl>& decls) {
  const int64_t hidden = o.hidden_size;
  const int64_t inter = o.moe_intermediate_size;
  for (int e = 0; e < o.num_routed_experts; ++e) {
    for (int w = 1; w <= 3; ++w) {
      const int64_t out = w == 2 ? hidden : inter;
      const int64_t in = w == 2 ? inter : hidden;
      decls.push_back({ExpertTensorName(prefix, e, w, "weight"),
                       checkpoint::DType::kU8,
                       {out, in / 2}});
      decls.push_back({ExpertTensorName(prefix, e, w, "scale"),
                       checkpoint::DType::kF8E8M0,
                       {out, in / 32}});
    }
  }
}

// The UE8M0 exponent codes around which the block scales of w1, w2 and w3
// of the routed experts are drawn.
struct ExpertExponents {
  int w1 = 0;
  int w2 = 0;
  int w3 = 0;
};

// The experts of the Engram-only checkpoints: near 2^-7 (w3 one above w1).
constexpr ExpertExponents kEngramOnlyExpertExponents = {
    .w1 = 120, .w2 = 119, .w3 = 121};

// Root mean square of random e2m1 codes (uniform over the 16) times a
// uniform block exponent offset in [-2, 2]:
// sqrt(68.5 / 8 * (1/16 + 1/4 + 1 + 4 + 16) / 5).
constexpr double kRandomMxfp4Rms = 6.04;

// The exponent code that gives random MXFP4 weights with `in` inputs an rms
// near 1 / sqrt(in), so that y = W x keeps the scale of a normalized x.
int UnitGainExponent(int64_t in) {
  const double want =
      1.0 / (kRandomMxfp4Rms * std::sqrt(static_cast<double>(in)));
  return std::clamp(127 + static_cast<int>(std::lround(std::log2(want))), 3,
                    251);
}

// Random e2m1 nibbles and UE8M0 block exponents within +-2 of a base that
// differs by weight (w3 one above w1, so w1/w3 sharing matters).
absl::Status WriteExperts(const SyntheticCheckpointOptions& o,
                          const std::string& prefix, int seed_layer,
                          const ExpertExponents& exponents,
                          checkpoint::SafetensorsWriter& writer) {
  const int64_t hidden = o.hidden_size;
  const int64_t inter = o.moe_intermediate_size;
  for (int e = 0; e < o.num_routed_experts; ++e) {
    for (int w = 1; w <= 3; ++w) {
      SplitMix mix(RowSeed(o.seed, seed_layer, -(100 + 4 * e + w)));
      const int64_t out = w == 2 ? hidden : inter;
      const int64_t in = w == 2 ? inter : hidden;
      std::vector<uint8_t> packed(out * in / 2);
      for (uint8_t& b : packed) b = static_cast<uint8_t>(mix.Next() & 0xFF);
      const int base = w == 1   ? exponents.w1
                       : w == 3 ? exponents.w3
                                : exponents.w2;
      std::vector<uint8_t> scales(out * in / 32);
      for (uint8_t& s : scales) {
        s = static_cast<uint8_t>(base + static_cast<int>(mix.Next() % 5) - 2);
      }
      if (absl::Status st =
              writer.Append(ExpertTensorName(prefix, e, w, "weight"), packed);
          !st.ok()) {
        return st;
      }
      if (absl::Status st =
              writer.Append(ExpertTensorName(prefix, e, w, "scale"), scales);
          !st.ok()) {
        return st;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteBf16(const std::string& name, int64_t count, uint64_t seed,
                       checkpoint::SafetensorsWriter& writer) {
  SplitMix mix(seed);
  std::vector<uint8_t> bytes(count * 2);
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t v =
        formats::FloatToBf16(1.0f + (mix.Uniform() - 0.5f) * 0.2f);
    bytes[2 * i] = static_cast<uint8_t>(v & 0xFF);
    bytes[2 * i + 1] = static_cast<uint8_t>(v >> 8);
  }
  return writer.Append(name, bytes);
}

// --- The full model (Contents::kFullModel) ---

// A seed for the tensor `name`, so that its values depend only on (seed,
// name): FNV-1a of the name, mixed with the seed.
uint64_t TensorSeed(uint64_t seed, absl::string_view name) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (const char c : name) {
    hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001B3ULL;
  }
  return SplitMix(seed ^ hash).Next();
}

// Approximately N(0, 1): four uniforms, centred and scaled to unit variance
// (no transcendental functions, so identical on every platform).
float Normal(SplitMix& mix) {
  const float sum =
      mix.Uniform() + mix.Uniform() + mix.Uniform() + mix.Uniform();
  return (sum - 2.0f) * 1.7320508f;
}

// The tensors of one shard, generated in memory before the shard is
// written (a layer of a miniature model is a few MB at most). Values are
// drawn per tensor from TensorSeed(seed, name).
class ShardTensors {
 public:
  explicit ShardTensors(uint64_t seed) : seed_(seed) {}

  // F32 tensor of `shape` with values mean + stddev x N(0, 1).
  void AddF32(const std::string& name, std::vector<int64_t> shape, float mean,
              float stddev) {
    const std::vector<float> values = Normals(name, mean, stddev, shape);
    AddF32Values(name, std::move(shape), values);
  }
  // F32 tensor with the given values.
  void AddF32Values(const std::string& name, std::vector<int64_t> shape,
                    const std::vector<float>& values) {
    std::vector<uint8_t> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    Add({name, checkpoint::DType::kF32, std::move(shape)}, std::move(bytes));
  }
  // RMSNorm weight [dim]: 1 + 0.05 x N(0, 1).
  void AddNorm(const std::string& name, int64_t dim) {
    AddF32(name, {dim}, 1.0f, 0.05f);
  }
  // BF16 tensor of `shape` with values stddev x N(0, 1).
  void AddBf16(const std::string& name, std::vector<int64_t> shape,
               float stddev) {
    const std::vector<float> values = Normals(name, 0.0f, stddev, shape);
    std::vector<uint8_t> bytes(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t v = formats::FloatToBf16(values[i]);
      bytes[2 * i] = static_cast<uint8_t>(v & 0xFF);
      bytes[2 * i + 1] = static_cast<uint8_t>(v >> 8);
    }
    Add({name, checkpoint::DType::kBf16, std::move(shape)}, std::move(bytes));
  }
  // FP8 linear layer `prefix`: .weight F8_E4M3 [out, in] with values
  // N(0, 1) / sqrt(in), .scale F8_E8M0 [ceil(out / 32), ceil(in / 32)].
  void AddFp8Linear(const std::string& prefix, int64_t out, int64_t in) {
    const std::string weight = prefix + ".weight";
    const std::vector<float> values = Normals(
        weight, 0.0f, 1.0f / std::sqrt(static_cast<float>(in)), {out, in});
    std::vector<uint8_t> codes(values.size());
    std::vector<uint8_t> scales;
    EncodeFp8Blocks(values, in, absl::MakeSpan(codes), scales);
    Add({weight, checkpoint::DType::kF8E4M3, {out, in}}, std::move(codes));
    Add({prefix + ".scale",
         checkpoint::DType::kF8E8M0,
         {(out + kFp8Block - 1) / kFp8Block, (in + kFp8Block - 1) / kFp8Block}},
        std::move(scales));
  }

  // mean + stddev x N(0, 1) for every element of `shape`, from the seed of
  // tensor `name`.
  std::vector<float> Normals(const std::string& name, float mean, float stddev,
                             const std::vector<int64_t>& shape) const {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    SplitMix mix(TensorSeed(seed_, name));
    std::vector<float> values(count);
    for (float& v : values) v = mean + stddev * Normal(mix);
    return values;
  }

  const std::vector<checkpoint::TensorDecl>& decls() const { return decls_; }

  // Appends every tensor to `writer`, which must declare them.
  absl::Status AppendTo(checkpoint::SafetensorsWriter& writer) const {
    for (size_t i = 0; i < decls_.size(); ++i) {
      if (absl::Status st = writer.Append(decls_[i].name, bytes_[i]);
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }

 private:
  void Add(checkpoint::TensorDecl decl, std::vector<uint8_t> bytes) {
    decls_.push_back(std::move(decl));
    bytes_.push_back(std::move(bytes));
  }

  const uint64_t seed_;
  std::vector<checkpoint::TensorDecl> decls_;
  std::vector<std::vector<uint8_t>> bytes_;
};

// sigmoid(b) = 1 / hc_mult: the bias that makes each copy's pre weight (and
// the head's) about 1 / hc_mult, so that the weighted sum of identical
// copies is about one copy.
float PreBias(int hc_mult) {
  return -static_cast<float>(std::log(static_cast<double>(hc_mult - 1)));
}

// Hyper-connection mixing of one sub-layer (hc_mult > 1): `prefix`_fn
// [(2 + hc) hc, hc D] small, so the mix is dominated by `prefix`_base:
// pre ~ 1 / hc, post = 2 sigmoid(~0) ~ 1, comb logits 2 on the diagonal and
// 0 elsewhere (after Sinkhorn ~0.7 on the diagonal); `prefix`_scale [3] ~ 1.
void AddHcMix(const SyntheticCheckpointOptions& o, const std::string& prefix,
              ShardTensors& t) {
  const int64_t hc = o.hc_mult;
  const int64_t mix = (2 + hc) * hc;
  const int64_t in = hc * o.hidden_size;
  t.AddF32(prefix + "_fn", {mix, in}, 0.0f,
           0.1f / std::sqrt(static_cast<float>(in)));
  std::vector<float> base =
      t.Normals(prefix + "_base", 0.0f, 0.1f, std::vector<int64_t>{mix});
  for (int64_t i = 0; i < hc; ++i) base[i] += PreBias(o.hc_mult);
  for (int64_t i = 0; i < hc; ++i) base[2 * hc + i * hc + i] += 2.0f;
  t.AddF32Values(prefix + "_base", {mix}, base);
  t.AddF32(prefix + "_scale", {3}, 1.0f, 0.1f);
}

// Every tensor of main layer `layer` but its Engram and routed experts.
ShardTensors LayerTensors(const SyntheticCheckpointOptions& o, int layer) {
  ShardTensors t(o.seed);
  const std::string p = absl::StrCat("layers.", layer, ".");
  const int64_t d = o.hidden_size;
  const int64_t hd = o.head_dim;
  const int64_t heads = o.num_attention_heads;
  const int64_t groups = o.o_groups;
  t.AddNorm(p + "attn_norm.weight", d);
  t.AddNorm(p + "ffn_norm.weight", d);
  if (o.hc_mult > 1) {
    AddHcMix(o, p + "hc_attn", t);
    AddHcMix(o, p + "hc_ffn", t);
  }
  const std::string attn = p + "attn.";
  t.AddFp8Linear(attn + "wq_a", o.q_lora_rank, d);
  t.AddNorm(attn + "q_norm.weight", o.q_lora_rank);
  t.AddFp8Linear(attn + "wq_b", heads * hd, o.q_lora_rank);
  t.AddFp8Linear(attn + "wkv", hd, d);
  t.AddNorm(attn + "kv_norm.weight", hd);
  t.AddFp8Linear(attn + "wo_a", groups * o.o_lora_rank, heads / groups * hd);
  t.AddFp8Linear(attn + "wo_b", d, groups * o.o_lora_rank);
  t.AddF32(attn + "attn_sink", {heads}, 0.0f, 0.5f);
  if (const int64_t ratio = o.compress_ratios[layer]; ratio > 0) {
    const std::string c = attn + "compressor.";
    t.AddFp8Linear(c + "wkv", hd, d);
    t.AddFp8Linear(c + "wgate", hd, d);
    t.AddF32(c + "ape", {ratio, hd}, 0.0f, 0.1f);
    t.AddNorm(c + "norm.weight", hd);
  }
  const std::string ffn = p + "ffn.";
  const int64_t experts = o.num_routed_experts;
  t.AddBf16(ffn + "gate.weight", {experts, d},
            1.0f / std::sqrt(static_cast<float>(d)));
  // Small against the score spread, so biased and unbiased top-k differ for
  // some tokens only.
  t.AddF32(ffn + "gate.bias", {experts}, 0.0f, 0.03f);
  if (o.n_shared_experts > 0) {
    const int64_t inter = int64_t{o.n_shared_experts} * o.moe_intermediate_size;
    t.AddFp8Linear(ffn + "shared_experts.w1", inter, d);
    t.AddFp8Linear(ffn + "shared_experts.w2", d, inter);
    t.AddFp8Linear(ffn + "shared_experts.w3", inter, d);
  }
  return t;
}

// embed, head, norm and hc_head_* (hc_mult > 1).
ShardTensors TopLevelTensors(const SyntheticCheckpointOptions& o) {
  ShardTensors t(o.seed);
  const int64_t vocab = SyntheticVocabSize();
  const int64_t d = o.hidden_size;
  t.AddBf16("embed.weight", {vocab, d}, 1.0f);
  // Logits = head . (unit-rms x): std 3 over the vocabulary.
  t.AddBf16("head.weight", {vocab, d}, 3.0f / std::sqrt(static_cast<float>(d)));
  t.AddNorm("norm.weight", d);
  if (o.hc_mult > 1) {
    const int64_t hc = o.hc_mult;
    t.AddF32("hc_head_fn", {hc, hc * d}, 0.0f,
             0.1f / std::sqrt(static_cast<float>(hc * d)));
    std::vector<float> base =
        t.Normals("hc_head_base", 0.0f, 0.1f, std::vector<int64_t>{hc});
    for (float& b : base) b += PreBias(o.hc_mult);
    t.AddF32Values("hc_head_base", {hc}, base);
    t.AddF32("hc_head_scale", {1}, 1.0f, 0.1f);
  }
  return t;
}

// Writes `tensors`, then the MXFP4 routed experts of `expert_prefix` (none
// when empty), as shard file `shard` of `dir`, and maps them in `index`.
absl::Status WriteModelShard(const SyntheticCheckpointOptions& o,
                             const std::string& dir, const std::string& shard,
                             const ShardTensors& tensors,
                             const std::string& expert_prefix,
                             int expert_seed_layer,
                             checkpoint::CheckpointIndex& index,
                             uint64_t& total_size) {
  std::vector<checkpoint::TensorDecl> decls = tensors.decls();
  if (!expert_prefix.empty()) AddExpertDecls(o, expert_prefix, decls);
  for (const checkpoint::TensorDecl& d : decls)
    index.weight_map[d.name] = shard;
  absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsWriter>> writer =
      checkpoint::SafetensorsWriter::Create(dir + "/" + shard, decls,
                                            {.metadata = {{"format", "pt"}}});
  if (!writer.ok()) return writer.status();
  if (absl::Status st = tensors.AppendTo(**writer); !st.ok()) return st;
  if (!expert_prefix.empty()) {
    const ExpertExponents exponents = {
        .w1 = UnitGainExponent(o.hidden_size),
        .w2 = UnitGainExponent(o.moe_intermediate_size),
        .w3 = UnitGainExponent(o.hidden_size) + 1};
    if (absl::Status st = WriteExperts(o, expert_prefix, expert_seed_layer,
                                       exponents, **writer);
        !st.ok()) {
      return st;
    }
  }
  total_size += (*writer)->data_bytes();
  return (*writer)->Finish();
}

}  // namespace

SyntheticCheckpointOptions TinyModelOptions() {
  SyntheticCheckpointOptions o;
  o.contents = Contents::kFullModel;
  o.hidden_size = 256;
  o.num_hidden_layers = 4;
  o.engram_layer_ids = {1, 3};
  o.hc_mult = 4;
  o.num_routed_experts = 16;
  o.moe_intermediate_size = 64;
  o.num_experts_per_tok = 2;
  o.compress_ratios = {0, 1, 2, 4};
  return o;
}

float SyntheticTableAmax(int layer_index) {
  return layer_index == 0 ? 11.0f : 24.0f;
}

void SyntheticRowValues(uint64_t seed, int layer, int64_t row,
                        absl::Span<float> out) {
  SplitMix mix(RowSeed(seed, layer, row));
  // Per-row magnitude (rows differ by ~30x), then a Pareto-tailed value per
  // element: heavy tails as trained embedding tables have, no transcendental
  // functions so the values are identical on every platform.
  const float u = mix.Uniform();
  const float row_scale = 0.01f + 0.3f * u * u * u;
  // The layer index is not known here; both layers clip at their own amax,
  // which the caller's table amax covers (24 >= 11 is handled by the clip
  // below using the layer's position in the synthetic layout: layer ids
  // below 2 are the first table).
  const float amax = SyntheticTableAmax(layer < 2 ? 0 : 1);
  for (float& v : out) {
    const uint64_t bits = mix.Next();
    const float uniform = static_cast<float>(bits >> 40) * 0x1p-24f;
    float magnitude = row_scale * (1.0f / (uniform * 0.98f + 0.02f) - 1.0f);
    magnitude = std::min(magnitude, amax);
    v = (bits & 1) ? -magnitude : magnitude;
  }
}

absl::Status MakeSyntheticCheckpoint(const SyntheticCheckpointOptions& o) {
  if (absl::Status st = Validate(o); !st.ok()) return st;
  std::error_code ec;
  if (fs::exists(o.out_dir, ec) &&
      (!fs::is_directory(o.out_dir, ec) || !fs::is_empty(o.out_dir, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--out=", o.out_dir, " exists and is not an empty directory"));
  }
  const std::string partial = o.out_dir + ".partial";
  fs::remove_all(partial, ec);
  if (!fs::create_directories(partial, ec)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", partial, ": ", ec.message()));
  }

  // Tokenizer and the compressed vocabulary it implies.
  const std::string tokenizer_path = partial + "/tokenizer.json";
  if (absl::Status st = WriteText(tokenizer_path, SyntheticTokenizerJson());
      !st.ok()) {
    return st;
  }
  if (absl::Status st = WriteText(
          partial + "/tokenizer_config.json",
          nlohmann::ordered_json{{"add_bos_token", true},
                                 {"add_eos_token", false},
                                 {"bos_token", "<｜begin▁of▁sentence｜>"},
                                 {"eos_token", "<｜end▁of▁sentence｜>"},
                                 {"pad_token", "<｜▁pad▁｜>"},
                                 {"clean_up_tokenization_spaces", false},
                                 {"model_max_length", 131072},
                                 {"tokenizer_class", "LlamaTokenizerFast"}}
                  .dump(2) +
              "\n");
      !st.ok()) {
    return st;
  }
  absl::StatusOr<std::unique_ptr<engram::CompressedVocabulary>> vocab =
      engram::CompressedVocabulary::Create(
          {.tokenizer_json_path = tokenizer_path});
  if (!vocab.ok()) return vocab.status();

  const bool full_model = o.contents == Contents::kFullModel;
  const int num_tables = static_cast<int>(o.engram_layer_ids.size());
  // Full model: one shard per layer and one for embed / head / norm.
  const int num_shards =
      num_tables + (full_model ? o.num_hidden_layers + 1
                               : static_cast<int>(o.expert_layer_ids.size()) +
                                     (o.draft_stages > 0 ? 1 : 0));
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes =
      engram::SearchColumnPrimes(o.engram_vocab_size, num_tables, kMaxNgramSize,
                                 kHeads);
  if (!primes.ok()) return primes.status();

  const bool nvfp4 = o.engram_format == RowFormat::kNvfp4;
  const int64_t wkv_out = int64_t{o.hc_mult + 1} * o.hidden_size;
  const int64_t wkv_in = int64_t{kColumns} * formats::kRowDim;
  checkpoint::CheckpointIndex index;
  uint64_t total_size = 0;
  std::vector<int64_t> num_embeddings;
  nlohmann::ordered_json global_scales = nlohmann::ordered_json::object();
  for (int t = 0; t < num_tables; ++t) {
    const int layer = o.engram_layer_ids[t];
    int64_t rows = 0;
    for (int64_t p : (*primes)[t]) rows += p;
    num_embeddings.push_back(rows);
    const float global_scale =
        nvfp4 ? formats::Nvfp4GlobalScale(SyntheticTableAmax(layer < 2 ? 0 : 1))
              : 1.0f;
    if (nvfp4) global_scales[std::to_string(layer)] = global_scale;

    const std::string prefix = absl::StrCat("layers.", layer, ".engram.");
    using checkpoint::DType;
    std::vector<checkpoint::TensorDecl> decls = {
        {prefix + "embed.weight",
         nvfp4 ? DType::kU8 : DType::kF8E4M3,
         {rows,
          static_cast<int64_t>(formats::RowWeightBytes(o.engram_format))}},
        {prefix + "embed.scale",
         nvfp4 ? DType::kF8E4M3 : DType::kF8E8M0,
         {rows, static_cast<int64_t>(formats::RowScaleBytes(o.engram_format))}},
        {prefix + "wkv.weight", DType::kF8E4M3, {wkv_out, wkv_in}},
        {prefix + "wkv.scale", DType::kF8E8M0, {wkv_out / 32, wkv_in / 32}},
        {prefix + "q_weight", DType::kBf16, {o.hc_mult, o.hidden_size}},
        {prefix + "k_weight", DType::kBf16, {o.hc_mult, o.hidden_size}},
    };
    const std::string shard = ShardName(t, num_shards);
    for (const checkpoint::TensorDecl& d : decls)
      index.weight_map[d.name] = shard;
    absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsWriter>> writer =
        checkpoint::SafetensorsWriter::Create(partial + "/" + shard, decls,
                                              {.metadata = {{"format", "pt"}}});
    if (!writer.ok()) return writer.status();
    if (absl::Status st = WriteTable(o, layer, t, rows, global_scale, **writer);
        !st.ok()) {
      return st;
    }
    if (absl::Status st = o.wkv_kind == WkvKind::kCorrelated
                              ? WriteCorrelatedWkv(o, layer, wkv_out, **writer)
                              : WriteWkv(o, layer, wkv_out, **writer);
        !st.ok()) {
      return st;
    }
    for (const char* name : {"q_weight", "k_weight"}) {
      if (absl::Status st = WriteBf16(
              prefix + name, int64_t{o.hc_mult} * o.hidden_size,
              RowSeed(o.seed, layer, name[0] == 'q' ? -2 : -3), **writer);
          !st.ok()) {
        return st;
      }
    }
    total_size += (*writer)->data_bytes();
    if (absl::Status st = (*writer)->Finish(); !st.ok()) return st;
  }
  // MXFP4 routed experts: one shard per main layer, one for the draft stages.
  std::vector<std::vector<std::pair<std::string, int>>> expert_shards;
  for (int layer : o.expert_layer_ids) {
    expert_shards.push_back({{absl::StrCat("layers.", layer), layer}});
  }
  if (o.draft_stages > 0) {
    expert_shards.emplace_back();
    for (int stage = 0; stage < o.draft_stages; ++stage) {
      expert_shards.back().push_back(
          {absl::StrCat("mtp.", stage), 1000 + stage});
    }
  }
  for (size_t i = 0; i < expert_shards.size(); ++i) {
    std::vector<checkpoint::TensorDecl> decls;
    for (const auto& [prefix, seed_layer] : expert_shards[i]) {
      AddExpertDecls(o, prefix, decls);
    }
    const std::string shard =
        ShardName(num_tables + static_cast<int>(i), num_shards);
    for (const checkpoint::TensorDecl& d : decls)
      index.weight_map[d.name] = shard;
    absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsWriter>> writer =
        checkpoint::SafetensorsWriter::Create(partial + "/" + shard, decls,
                                              {.metadata = {{"format", "pt"}}});
    if (!writer.ok()) return writer.status();
    for (const auto& [prefix, seed_layer] : expert_shards[i]) {
      if (absl::Status st = WriteExperts(o, prefix, seed_layer,
                                         kEngramOnlyExpertExponents, **writer);
          !st.ok()) {
        return st;
      }
    }
    total_size += (*writer)->data_bytes();
    if (absl::Status st = (*writer)->Finish(); !st.ok()) return st;
  }
  if (full_model) {
    for (int layer = 0; layer < o.num_hidden_layers; ++layer) {
      if (absl::Status st = WriteModelShard(
              o, partial, ShardName(num_tables + layer, num_shards),
              LayerTensors(o, layer), absl::StrCat("layers.", layer), layer,
              index, total_size);
          !st.ok()) {
        return st;
      }
    }
    if (absl::Status st =
            WriteModelShard(o, partial, ShardName(num_shards - 1, num_shards),
                            TopLevelTensors(o), /*expert_prefix=*/"",
                            /*expert_seed_layer=*/0, index, total_size);
        !st.ok()) {
      return st;
    }
  }
  index.total_size = total_size;
  if (absl::Status st = checkpoint::WriteCheckpointIndex(
          partial + "/" + std::string(checkpoint::kIndexFileName), index);
      !st.ok()) {
    return st;
  }

  nlohmann::ordered_json text_config = {
      {"model_type", "deepseek_v4"},
      {"vocab_size", SyntheticVocabSize()},
      {"hidden_size", o.hidden_size},
      {"num_hidden_layers", o.num_hidden_layers},
      {"hc_mult", o.hc_mult},
      {"bos_token_id", kBosTokenId},
      {"eos_token_id", kEosTokenId},
      {"rms_norm_eps", 1e-6},
      {"engram_layer_ids", o.engram_layer_ids},
      {"engram_num_embeddings", num_embeddings},
      {"engram_max_ngram_size", kMaxNgramSize},
      {"engram_n_heads", kHeads},
      {"engram_head_dim", formats::kRowDim},
      {"engram_vocab_size", o.engram_vocab_size},
      {"engram_compressed_vocab_size", (*vocab)->size()},
      {"engram_pad_token_id", kPadTokenId},
  };
  if (full_model) {
    text_config["hc_sinkhorn_iters"] = o.hc_sinkhorn_iters;
    text_config["hc_eps"] = kHcEps;
    text_config["num_attention_heads"] = o.num_attention_heads;
    text_config["head_dim"] = o.head_dim;
    text_config["qk_rope_head_dim"] = o.qk_rope_head_dim;
    text_config["rope_theta"] = o.rope_theta;
    text_config["q_lora_rank"] = o.q_lora_rank;
    text_config["o_lora_rank"] = o.o_lora_rank;
    text_config["o_groups"] = o.o_groups;
    text_config["sliding_window"] = o.sliding_window;
    text_config["compress_ratios"] = o.compress_ratios;
    text_config["n_routed_experts"] = o.num_routed_experts;
    text_config["num_experts_per_tok"] = o.num_experts_per_tok;
    text_config["n_shared_experts"] = o.n_shared_experts;
    text_config["moe_intermediate_size"] = o.moe_intermediate_size;
    text_config["routed_scaling_factor"] = o.routed_scaling_factor;
    text_config["swiglu_limit"] = o.swiglu_limit;
  } else if (!o.expert_layer_ids.empty() || o.draft_stages > 0) {
    text_config["n_routed_experts"] = o.num_routed_experts;
    text_config["moe_intermediate_size"] = o.moe_intermediate_size;
  }
  if (o.draft_stages > 0) {
    text_config["num_nextn_predict_layers"] = o.draft_stages;
  }
  if (nvfp4) {
    text_config["engram_quant"] = "nvfp4";
    text_config["engram_quant_block_size"] = formats::kNvfp4BlockSize;
    text_config["engram_quant_method"] = "rtn-amax";
    text_config["engram_quant_global_scale"] = global_scales;
  }
  nlohmann::ordered_json config = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"text_config", text_config},
  };
  if (full_model) {
    // As Hugging Face checkpoints of the family state their FP8 blocks.
    config["quantization_config"] = {
        {"quant_method", "fp8"},
        {"fmt", "e4m3"},
        {"scale_fmt", "ue8m0"},
        {"weight_block_size", {kFp8Block, kFp8Block}},
    };
  }
  config["mneme_synthetic"] = {{"seed", o.seed}};
  if (absl::Status st =
          WriteText(partial + "/config.json", config.dump(2) + "\n");
      !st.ok()) {
    return st;
  }
  if (fs::exists(o.out_dir, ec)) fs::remove(o.out_dir, ec);  // Empty dir.
  fs::rename(partial, o.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", partial, " to ",
                                            o.out_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace mneme::synthetic
