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
#include "common/status_macros.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/primes.h"
#include "formats/bf16.h"
#include "formats/block_pack/fp8_block.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/ue8m0.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/synthetic_checkpoint.h"
#include "tools/synthetic/synthetic_internal.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic::synthetic_internal {

using formats::RowFormat;

namespace {

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
    formats::EncodeFp8BlockMatrix(values, in, absl::MakeSpan(codes), &scales);
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
      RETURN_IF_ERROR(writer.Append(decls_[i].name, bytes_[i]));
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
  ASSIGN_OR_RETURN(
      std::unique_ptr<checkpoint::SafetensorsWriter> writer,
      checkpoint::SafetensorsWriter::Create(dir + "/" + shard, decls,
                                            {.metadata = {{"format", "pt"}}}));
  RETURN_IF_ERROR(tensors.AppendTo(*writer));
  if (!expert_prefix.empty()) {
    const ExpertExponents exponents = {
        .w1 = UnitGainExponent(o.hidden_size),
        .w2 = UnitGainExponent(o.moe_intermediate_size),
        .w3 = UnitGainExponent(o.hidden_size) + 1};
    RETURN_IF_ERROR(
        WriteExperts(o, expert_prefix, expert_seed_layer, exponents, *writer));
  }
  total_size += writer->data_bytes();
  return writer->Finish();
}

}  // namespace

absl::Status WriteFullModelShards(const SyntheticCheckpointOptions& o,
                                  const std::string& dir, int num_tables,
                                  int num_shards,
                                  checkpoint::CheckpointIndex& index,
                                  uint64_t& total_size) {
  for (int layer = 0; layer < o.num_hidden_layers; ++layer) {
    RETURN_IF_ERROR(
        WriteModelShard(o, dir, ShardName(num_tables + layer, num_shards),
                        LayerTensors(o, layer), absl::StrCat("layers.", layer),
                        layer, index, total_size));
  }
  RETURN_IF_ERROR(WriteModelShard(o, dir, ShardName(num_shards - 1, num_shards),
                                  TopLevelTensors(o), /*expert_prefix=*/"",
                                  /*expert_seed_layer=*/0, index, total_size));

  return absl::OkStatus();
}

}  // namespace mneme::synthetic::synthetic_internal
