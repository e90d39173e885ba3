#include "model/model_weights.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::model {

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(
    WeightLoader& load, const ModelDims& dims, const VocabShard& vocab,
    const EngramLayout& engram, int tp_rank, int tp_size) {
  const int64_t D = dims.hidden_size;
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->embedding_head,
                   LoadEmbeddingHeadWeights(load, dims, vocab));
  w->layers.resize(dims.num_layers);
  for (int l = 0; l < dims.num_layers; ++l) {
    LayerWeights& lw = w->layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    ASSIGN_OR_RETURN(lw.attn_norm, load.Vector(p + "attn_norm.weight", {D}));
    ASSIGN_OR_RETURN(lw.ffn_norm, load.Vector(p + "ffn_norm.weight", {D}));
    ASSIGN_OR_RETURN(lw.hc_attn,
                     LoadHcSublayerWeights(load, p + "hc_attn", dims));
    ASSIGN_OR_RETURN(lw.hc_ffn,
                     LoadHcSublayerWeights(load, p + "hc_ffn", dims));
    ASSIGN_OR_RETURN(lw.attn, LoadAttentionWeights(load, p + "attn.", dims, l,
                                                   tp_rank, tp_size));
    ASSIGN_OR_RETURN(
        lw.ffn, LoadMoeWeights(load, p + "ffn.", dims, l, tp_rank, tp_size));
    if (dims.IsEngramLayer(l)) {
      ASSIGN_OR_RETURN(EngramWeights e,
                       LoadEngramWeights(load, p + "engram.", dims, engram));
      lw.engram = std::make_unique<EngramWeights>(std::move(e));
    }
  }
  if (dims.IsV41()) {
    for (const char* name : {"image_start", "image_end", "image_newline"}) {
      if (load.Has(name)) {
        RETURN_IF_ERROR(load.Check(
            name, {checkpoint::DType::kBf16, checkpoint::DType::kF32}, {D}));
      }
    }
  }
  RETURN_IF_ERROR(CheckDraftLayers(load, dims));
  return w;
}

absl::Status CheckDraftLayers(const WeightLoader& load, const ModelDims& dims) {
  using checkpoint::DType;
  const int64_t D = dims.hidden_size, hd = dims.head_dim, hc = dims.hc_mult;
  const int64_t mix = (2 + hc) * hc;
  const std::vector<DType> dense = {DType::kBf16, DType::kF32};
  const std::vector<DType> f32 = {DType::kF32};
  const bool dspark = dims.dspark_block_size > 0;
  for (int s = 0; s < dims.num_draft_layers; ++s) {
    const std::string p = absl::StrCat("mtp.", s, ".");
    RETURN_IF_ERROR(load.Check(p + "attn_norm.weight", dense, {D}));
    RETURN_IF_ERROR(load.Check(p + "ffn_norm.weight", dense, {D}));
    for (const char* site : {"hc_attn", "hc_ffn"}) {
      RETURN_IF_ERROR(
          load.Check(absl::StrCat(p, site, "_fn"), f32, {mix, hc * D}));
      RETURN_IF_ERROR(load.Check(absl::StrCat(p, site, "_base"), f32, {mix}));
      RETURN_IF_ERROR(load.Check(absl::StrCat(p, site, "_scale"), f32, {3}));
    }
    const std::string a = p + "attn.";
    RETURN_IF_ERROR(load.CheckLinear(a + "wq_a", dims.q_lora_rank, D));
    RETURN_IF_ERROR(load.Check(a + "q_norm.weight", dense, {dims.q_lora_rank}));
    RETURN_IF_ERROR(
        load.CheckLinear(a + "wq_b", dims.num_heads * hd, dims.q_lora_rank));
    RETURN_IF_ERROR(load.CheckLinear(a + "wkv", hd, D));
    RETURN_IF_ERROR(load.Check(a + "kv_norm.weight", dense, {hd}));
    RETURN_IF_ERROR(load.CheckLinear(a + "wo_a",
                                     dims.o_groups * dims.o_lora_rank,
                                     dims.num_heads / dims.o_groups * hd));
    RETURN_IF_ERROR(
        load.CheckLinear(a + "wo_b", D, dims.o_groups * dims.o_lora_rank));
    RETURN_IF_ERROR(load.Check(a + "attn_sink", f32, {dims.num_heads}));
    RETURN_IF_ERROR(
        CheckDraftMoe(load, p + "ffn.", dims,
                      dspark ? dims.draft_num_experts : dims.num_experts));
    const bool last = s == dims.num_draft_layers - 1;
    if (!dspark) {
      // V4's MTP block.
      RETURN_IF_ERROR(load.CheckLinear(p + "e_proj", D, D));
      RETURN_IF_ERROR(load.CheckLinear(p + "h_proj", D, D));
      for (const char* n : {"enorm", "hnorm", "norm"}) {
        RETURN_IF_ERROR(load.Check(absl::StrCat(p, n, ".weight"), dense, {D}));
      }
    }
    if (!dspark || (last && load.Has(p + "hc_head_fn"))) {
      RETURN_IF_ERROR(load.Check(p + "hc_head_fn", f32, {hc, hc * D}));
      RETURN_IF_ERROR(load.Check(p + "hc_head_base", f32, {hc}));
      RETURN_IF_ERROR(load.Check(p + "hc_head_scale", f32, {1}));
    }
    if (!dspark) continue;
    if (s == 0) {
      const int64_t taps =
          static_cast<int64_t>(dims.dspark_target_layers.size());
      RETURN_IF_ERROR(load.CheckLinear(p + "main_proj", D, taps * D));
      RETURN_IF_ERROR(load.Check(p + "main_norm.weight", dense, {D}));
    }
    if (last) {
      const int64_t rank = dims.dspark_markov_rank;
      RETURN_IF_ERROR(load.Check(p + "norm.weight", dense, {D}));
      // V4.1 names the Markov head's tensors embed / head, V4-Flash-0731
      // markov_w1 (the embedding) / markov_w2 (the projection).
      const bool w_names = load.Has(p + "markov_head.markov_w1.weight");
      RETURN_IF_ERROR(load.Check(p + (w_names ? "markov_head.markov_w1.weight"
                                              : "markov_head.embed.weight"),
                                 dense, {dims.vocab_size, rank}));
      RETURN_IF_ERROR(load.Check(p + (w_names ? "markov_head.markov_w2.weight"
                                              : "markov_head.head.weight"),
                                 dense, {dims.vocab_size, rank}));
      RETURN_IF_ERROR(
          load.Check(p + "confidence_head.proj.weight", dense, {1, D + rank}));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::model
