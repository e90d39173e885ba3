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
#include "tools/synthetic/synthetic_internal.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic {
namespace {

namespace fs = std::filesystem;
using formats::RowFormat;
using synthetic_internal::AddExpertDecls;
using synthetic_internal::kColumns;
using synthetic_internal::kEngramOnlyExpertExponents;
using synthetic_internal::kHeads;
using synthetic_internal::kMaxNgramSize;
using synthetic_internal::RowSeed;
using synthetic_internal::ShardName;
using synthetic_internal::SplitMix;
using synthetic_internal::Validate;
using synthetic_internal::WriteBf16;
using synthetic_internal::WriteCorrelatedWkv;
using synthetic_internal::WriteExperts;
using synthetic_internal::WriteTable;
using synthetic_internal::WriteWkv;

absl::Status WriteText(const std::string& path, const std::string& text) {
  return mneme::WriteFileAtomically(path, text);
}

}  // namespace

namespace synthetic_internal {

std::string ShardName(int index, int count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

}  // namespace synthetic_internal

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
  RETURN_IF_ERROR(Validate(o));
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
  RETURN_IF_ERROR(WriteText(tokenizer_path, SyntheticTokenizerJson()));
  RETURN_IF_ERROR(WriteText(
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
          "\n"));
  ASSIGN_OR_RETURN(std::unique_ptr<engram::CompressedVocabulary> vocab,
                   engram::CompressedVocabulary::Create(
                       {.tokenizer_json_path = tokenizer_path}));

  const int num_tables = static_cast<int>(o.engram_layer_ids.size());
  const int num_shards = num_tables +
                         static_cast<int>(o.expert_layer_ids.size()) +
                         (o.draft_stages > 0 ? 1 : 0);
  ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> primes,
                   engram::SearchColumnPrimes(o.engram_vocab_size, num_tables,
                                              kMaxNgramSize, kHeads));

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
    for (int64_t p : primes[t]) rows += p;
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
    ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::SafetensorsWriter> writer,
                     checkpoint::SafetensorsWriter::Create(
                         absl::StrCat(partial, "/", shard), decls,
                         {.metadata = {{"format", "pt"}}}));
    RETURN_IF_ERROR(WriteTable(o, layer, t, rows, global_scale, *writer));
    RETURN_IF_ERROR(o.wkv_kind == WkvKind::kCorrelated
                        ? WriteCorrelatedWkv(o, layer, wkv_out, *writer)
                        : WriteWkv(o, layer, wkv_out, *writer));
    for (const char* name : {"q_weight", "k_weight"}) {
      RETURN_IF_ERROR(
          WriteBf16(prefix + name, int64_t{o.hc_mult} * o.hidden_size,
                    RowSeed(o.seed, layer, name[0] == 'q' ? -2 : -3), *writer));
    }
    total_size += writer->data_bytes();
    RETURN_IF_ERROR(writer->Finish());
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
    ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::SafetensorsWriter> writer,
                     checkpoint::SafetensorsWriter::Create(
                         absl::StrCat(partial, "/", shard), decls,
                         {.metadata = {{"format", "pt"}}}));
    for (const auto& [prefix, seed_layer] : expert_shards[i]) {
      RETURN_IF_ERROR(WriteExperts(o, prefix, seed_layer,
                                   kEngramOnlyExpertExponents, *writer));
    }
    total_size += writer->data_bytes();
    RETURN_IF_ERROR(writer->Finish());
  }
  index.total_size = total_size;
  RETURN_IF_ERROR(checkpoint::WriteCheckpointIndex(
      partial + "/" + std::string(checkpoint::kIndexFileName), index));

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
      {"engram_compressed_vocab_size", vocab->size()},
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
    text_config["engram_quant_block_size"] = formats::kNvfp4BlockSize;
    text_config["engram_quant_method"] = "rtn-amax";
    text_config["engram_quant_global_scale"] = global_scales;
  }
  nlohmann::ordered_json config = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"text_config", text_config},
  };
  config["mneme_synthetic"] = {{"seed", o.seed}};
  RETURN_IF_ERROR(WriteText(partial + "/config.json", config.dump(2) + "\n"));
  if (fs::exists(o.out_dir, ec)) fs::remove(o.out_dir, ec);  // Empty dir.
  fs::rename(partial, o.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", partial, " to ",
                                            o.out_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace mneme::synthetic
