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
#include "engram_store/checkpoint/checkpoint_index.h"
#include "engram_store/checkpoint/dtype.h"
#include "engram_store/checkpoint/engram_table.h"
#include "engram_store/checkpoint/file_io.h"
#include "engram_store/checkpoint/safetensors_writer.h"
#include "engram_store/format/bf16.h"
#include "engram_store/format/e4m3.h"
#include "engram_store/format/row_decode.h"
#include "engram_store/format/row_encode.h"
#include "engram_store/format/ue8m0.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/primes.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic {
namespace {

namespace fs = std::filesystem;
using engram::RowFormat;

constexpr int kMaxNgramSize = 4;
constexpr int kHeads = 8;
constexpr int kColumns = (kMaxNgramSize - 1) * kHeads;
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
  return engram::WriteFileAtomically(path, text);
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
  return absl::OkStatus();
}

// Encodes rows [first, first + count) of one table into `weights`/`scales`.
absl::Status EncodeRows(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, float global_scale, int64_t first,
                        int64_t count, uint8_t* weights, uint8_t* scales) {
  const RowFormat format = o.engram_format;
  const size_t wb = engram::RowWeightBytes(format);
  const size_t sb = engram::RowScaleBytes(format);
  std::vector<float> values(engram::kRowDim);
  std::vector<uint8_t> fp8(engram::RowBytes(RowFormat::kFp8));
  const engram::RowDecodeOptions fp8_decode{.format = RowFormat::kFp8};
  (void)layer_index;
  for (int64_t i = 0; i < count; ++i) {
    SyntheticRowValues(o.seed, layer, first + i, absl::MakeSpan(values));
    absl::Span<uint8_t> w(weights + i * wb, wb);
    absl::Span<uint8_t> s(scales + i * sb, sb);
    if (format == RowFormat::kFp8) {
      if (absl::Status st = engram::EncodeFp8Row(values, w, s); !st.ok()) {
        return st;
      }
      continue;
    }
    // NVFP4 tables are made from the FP8 table, as the real variant is.
    if (absl::Status st = engram::EncodeFp8Row(values, absl::MakeSpan(fp8));
        !st.ok()) {
      return st;
    }
    if (absl::Status st =
            engram::DecodeRowsF32(fp8_decode, fp8, absl::MakeSpan(values));
        !st.ok()) {
      return st;
    }
    if (absl::Status st = engram::EncodeNvfp4Row(values, global_scale, w, s);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTable(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, int64_t rows, float global_scale,
                        engram::SafetensorsWriter& writer) {
  const size_t wb = engram::RowWeightBytes(o.engram_format);
  const size_t sb = engram::RowScaleBytes(o.engram_format);
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1u, std::thread::hardware_concurrency());
  const int64_t batch_rows = kRowsPerTask * threads;
  std::vector<uint8_t> weights(batch_rows * wb);
  std::vector<uint8_t> scales(batch_rows * sb);
  const std::string weight_name = engram::EngramWeightTensorName(layer);
  const std::string scale_name = engram::EngramScaleTensorName(layer);
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
                      int64_t out_dim, engram::SafetensorsWriter& writer) {
  const int64_t in_dim = int64_t{kColumns} * engram::kRowDim;
  SplitMix mix(RowSeed(o.seed, layer, -1));
  std::vector<uint8_t> row(in_dim);
  const std::string prefix = absl::StrCat("layers.", layer, ".engram.wkv.");
  for (int64_t r = 0; r < out_dim; ++r) {
    for (int64_t c = 0; c < in_dim; ++c) {
      // Roughly N(0, 1)-sized e4m3 codes: sum of uniforms.
      const float v =
          (mix.Uniform() + mix.Uniform() + mix.Uniform() - 1.5f) * 2.0f;
      row[c] = engram::FloatToE4m3(v);
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

// wkv.weight with correlated inputs (WkvKind::kCorrelated): bands of 32
// rows are generated in fp32, then encoded with one UE8M0 scale per 32 x 32
// block from the block's amax.
absl::Status WriteCorrelatedWkv(const SyntheticCheckpointOptions& o, int layer,
                                int64_t out_dim,
                                engram::SafetensorsWriter& writer) {
  constexpr int64_t kBlock = 32;
  constexpr float kRho = 0.5f;
  const float innovation = std::sqrt(1.0f - kRho * kRho);
  const int64_t in_dim = int64_t{kColumns} * engram::kRowDim;
  SplitMix mix(RowSeed(o.seed, layer, -4));
  // Per-input scale in [0.5, 2), fixed for the layer.
  std::vector<float> input_scale(in_dim);
  for (float& s : input_scale) s = 0.5f + 1.5f * mix.Uniform();
  const std::string prefix = absl::StrCat("layers.", layer, ".engram.wkv.");
  std::vector<uint8_t> scales;
  std::vector<float> band;
  std::vector<uint8_t> codes;
  for (int64_t first = 0; first < out_dim; first += kBlock) {
    const int64_t rows = std::min(kBlock, out_dim - first);
    band.assign(rows * in_dim, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float a = 0.0f;
      for (int64_t c = 0; c < in_dim; ++c) {
        const float z =
            (mix.Uniform() + mix.Uniform() + mix.Uniform() - 1.5f) * 2.0f;
        a = c % engram::kRowDim == 0 ? z : kRho * a + innovation * z;
        band[r * in_dim + c] = input_scale[c] * a;
      }
    }
    codes.resize(rows * in_dim);
    for (int64_t b = 0; b < in_dim / kBlock; ++b) {
      float amax = 0.0f;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < kBlock; ++j) {
          amax = std::max(amax, std::fabs(band[r * in_dim + b * kBlock + j]));
        }
      }
      const uint8_t e = engram::FloatToUe8m0(amax / engram::kE4m3Max);
      scales.push_back(e);
      // 2^-(e - 127) exactly.
      const float inverse = engram::Ue8m0ToFloat(static_cast<uint8_t>(254 - e));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < kBlock; ++j) {
          const int64_t i = r * in_dim + b * kBlock + j;
          codes[i] = engram::FloatToE4m3(band[i] * inverse);
        }
      }
    }
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
                    std::vector<engram::TensorDecl>& decls) {
  const int64_t hidden = o.hidden_size;
  const int64_t inter = o.moe_intermediate_size;
  for (int e = 0; e < o.num_routed_experts; ++e) {
    for (int w = 1; w <= 3; ++w) {
      const int64_t out = w == 2 ? hidden : inter;
      const int64_t in = w == 2 ? inter : hidden;
      decls.push_back({ExpertTensorName(prefix, e, w, "weight"),
                       engram::DType::kU8,
                       {out, in / 2}});
      decls.push_back({ExpertTensorName(prefix, e, w, "scale"),
                       engram::DType::kF8E8M0,
                       {out, in / 32}});
    }
  }
}

// Random e2m1 nibbles and UE8M0 block exponents within +-2 of a base that
// differs by weight (w3 one above w1, so w1/w3 sharing matters).
absl::Status WriteExperts(const SyntheticCheckpointOptions& o,
                          const std::string& prefix, int seed_layer,
                          engram::SafetensorsWriter& writer) {
  const int64_t hidden = o.hidden_size;
  const int64_t inter = o.moe_intermediate_size;
  for (int e = 0; e < o.num_routed_experts; ++e) {
    for (int w = 1; w <= 3; ++w) {
      SplitMix mix(RowSeed(o.seed, seed_layer, -(100 + 4 * e + w)));
      const int64_t out = w == 2 ? hidden : inter;
      const int64_t in = w == 2 ? inter : hidden;
      std::vector<uint8_t> packed(out * in / 2);
      for (uint8_t& b : packed) b = static_cast<uint8_t>(mix.Next() & 0xFF);
      const int base = w == 1 ? 120 : w == 3 ? 121 : 119;
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
                       engram::SafetensorsWriter& writer) {
  SplitMix mix(seed);
  std::vector<uint8_t> bytes(count * 2);
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t v =
        engram::FloatToBf16(1.0f + (mix.Uniform() - 0.5f) * 0.2f);
    bytes[2 * i] = static_cast<uint8_t>(v & 0xFF);
    bytes[2 * i + 1] = static_cast<uint8_t>(v >> 8);
  }
  return writer.Append(name, bytes);
}

}  // namespace

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

  const int num_tables = static_cast<int>(o.engram_layer_ids.size());
  const int num_shards = num_tables +
                         static_cast<int>(o.expert_layer_ids.size()) +
                         (o.draft_stages > 0 ? 1 : 0);
  absl::StatusOr<std::vector<std::vector<int64_t>>> primes =
      engram::SearchColumnPrimes(o.engram_vocab_size, num_tables, kMaxNgramSize,
                                 kHeads);
  if (!primes.ok()) return primes.status();

  const bool nvfp4 = o.engram_format == RowFormat::kNvfp4;
  const int64_t wkv_out = int64_t{o.hc_mult + 1} * o.hidden_size;
  const int64_t wkv_in = int64_t{kColumns} * engram::kRowDim;
  engram::CheckpointIndex index;
  uint64_t total_size = 0;
  std::vector<int64_t> num_embeddings;
  nlohmann::ordered_json global_scales = nlohmann::ordered_json::object();
  for (int t = 0; t < num_tables; ++t) {
    const int layer = o.engram_layer_ids[t];
    int64_t rows = 0;
    for (int64_t p : (*primes)[t]) rows += p;
    num_embeddings.push_back(rows);
    const float global_scale =
        nvfp4 ? engram::Nvfp4GlobalScale(SyntheticTableAmax(layer < 2 ? 0 : 1))
              : 1.0f;
    if (nvfp4) global_scales[std::to_string(layer)] = global_scale;

    const std::string prefix = absl::StrCat("layers.", layer, ".engram.");
    using engram::DType;
    std::vector<engram::TensorDecl> decls = {
        {prefix + "embed.weight",
         nvfp4 ? DType::kU8 : DType::kF8E4M3,
         {rows, static_cast<int64_t>(engram::RowWeightBytes(o.engram_format))}},
        {prefix + "embed.scale",
         nvfp4 ? DType::kF8E4M3 : DType::kF8E8M0,
         {rows, static_cast<int64_t>(engram::RowScaleBytes(o.engram_format))}},
        {prefix + "wkv.weight", DType::kF8E4M3, {wkv_out, wkv_in}},
        {prefix + "wkv.scale", DType::kF8E8M0, {wkv_out / 32, wkv_in / 32}},
        {prefix + "q_weight", DType::kBf16, {o.hc_mult, o.hidden_size}},
        {prefix + "k_weight", DType::kBf16, {o.hc_mult, o.hidden_size}},
    };
    const std::string shard = ShardName(t, num_shards);
    for (const engram::TensorDecl& d : decls) index.weight_map[d.name] = shard;
    absl::StatusOr<std::unique_ptr<engram::SafetensorsWriter>> writer =
        engram::SafetensorsWriter::Create(partial + "/" + shard, decls,
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
    std::vector<engram::TensorDecl> decls;
    for (const auto& [prefix, seed_layer] : expert_shards[i]) {
      AddExpertDecls(o, prefix, decls);
    }
    const std::string shard =
        ShardName(num_tables + static_cast<int>(i), num_shards);
    for (const engram::TensorDecl& d : decls) index.weight_map[d.name] = shard;
    absl::StatusOr<std::unique_ptr<engram::SafetensorsWriter>> writer =
        engram::SafetensorsWriter::Create(partial + "/" + shard, decls,
                                          {.metadata = {{"format", "pt"}}});
    if (!writer.ok()) return writer.status();
    for (const auto& [prefix, seed_layer] : expert_shards[i]) {
      if (absl::Status st = WriteExperts(o, prefix, seed_layer, **writer);
          !st.ok()) {
        return st;
      }
    }
    total_size += (*writer)->data_bytes();
    if (absl::Status st = (*writer)->Finish(); !st.ok()) return st;
  }
  index.total_size = total_size;
  if (absl::Status st = engram::WriteCheckpointIndex(
          partial + "/" + std::string(engram::kIndexFileName), index);
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
      {"engram_head_dim", engram::kRowDim},
      {"engram_vocab_size", o.engram_vocab_size},
      {"engram_compressed_vocab_size", (*vocab)->size()},
      {"engram_pad_token_id", kPadTokenId},
  };
  if (!o.expert_layer_ids.empty() || o.draft_stages > 0) {
    text_config["n_routed_experts"] = o.num_routed_experts;
    text_config["moe_intermediate_size"] = o.moe_intermediate_size;
  }
  if (o.draft_stages > 0) {
    text_config["num_nextn_predict_layers"] = o.draft_stages;
  }
  if (nvfp4) {
    text_config["engram_quant"] = "nvfp4";
    text_config["engram_quant_block_size"] = engram::kNvfp4BlockSize;
    text_config["engram_quant_method"] = "rtn-amax";
    text_config["engram_quant_global_scale"] = global_scales;
  }
  const nlohmann::ordered_json config = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"text_config", text_config},
      {"mneme_synthetic", {{"seed", o.seed}}},
  };
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
