#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::model {
namespace {

// An integer key that must lie in [lo, hi].
absl::Status GetIntIn(const checkpoint::ModelConfig& config, const char* key,
                      int64_t lo, int64_t hi, int64_t& out) {
  ASSIGN_OR_RETURN(const int64_t v, config.GetInt(key));
  if (v < lo || v > hi) {
    return config.KeyError(key,
                           absl::StrCat(v, " is outside [", lo, ", ", hi, "]"));
  }
  out = v;
  return absl::OkStatus();
}

absl::Status GetIntIn(const checkpoint::ModelConfig& config, const char* key,
                      int64_t lo, int64_t hi, int& out) {
  int64_t v = 0;
  RETURN_IF_ERROR(GetIntIn(config, key, lo, hi, v));
  out = static_cast<int>(v);
  return absl::OkStatus();
}

// An optional integer key: `fallback` when absent.
absl::Status GetOptionalIntIn(const checkpoint::ModelConfig& config,
                              const char* key, int64_t lo, int64_t hi,
                              int fallback, int& out) {
  if (config.Find(key) == nullptr) {
    out = fallback;
    return absl::OkStatus();
  }
  return GetIntIn(config, key, lo, hi, out);
}

// An optional number: `fallback` when absent; must be finite and in
// [lo, hi].
absl::Status GetOptionalFloat(const checkpoint::ModelConfig& config,
                              const char* key, double lo, double hi,
                              float fallback, float& out) {
  if (config.Find(key) == nullptr) {
    out = fallback;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const double v, config.GetDouble(key));
  if (!(v >= lo && v <= hi)) {
    return config.KeyError(key,
                           absl::StrCat(v, " is outside [", lo, ", ", hi, "]"));
  }
  out = static_cast<float>(v);
  return absl::OkStatus();
}

constexpr int64_t kMaxDim = int64_t{1} << 20;

// An optional list of distinct layer ids in [0, limit), sorted ascending.
absl::Status GetLayerList(const checkpoint::ModelConfig& config,
                          const char* key, int limit, std::vector<int>& out) {
  out.clear();
  const nlohmann::json* v = config.Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_array() || v->size() > 4096) {
    return config.KeyError(key, "must be a list of layer ids");
  }
  for (const nlohmann::json& e : *v) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
        e.get<int64_t>() >= limit) {
      return config.KeyError(
          key, absl::StrCat("every entry must be a layer in [0, ", limit, ")"));
    }
    out.push_back(e.get<int>());
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) {
    return config.KeyError(key, "repeats a layer");
  }
  return absl::OkStatus();
}

// YaRN: rope_scaling {type|rope_type: "yarn", factor,
// original_max_position_embeddings, beta_fast, beta_slow}, or the inference
// code's top-level original_seq_len / rope_factor / beta_fast / beta_slow.
absl::Status GetYarn(const checkpoint::ModelConfig& config, YarnParams& y) {
  auto number = [&](const nlohmann::json& obj, const char* key,
                    const char* where, double lo, double hi, double fallback,
                    double& out) -> absl::Status {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) {
      out = fallback;
      return absl::OkStatus();
    }
    if (!it->is_number() || !(it->get<double>() >= lo) ||
        !(it->get<double>() <= hi)) {
      return config.KeyError(where, absl::StrCat(key, " must be a number in [",
                                                 lo, ", ", hi, "]"));
    }
    out = it->get<double>();
    return absl::OkStatus();
  };
  double orig = 0, factor = 1, fast = 32, slow = 1;
  if (const nlohmann::json* rs = config.Find("rope_scaling")) {
    if (!rs->is_object()) {
      return config.KeyError("rope_scaling", "must be an object");
    }
    std::string type;
    for (const char* k : {"type", "rope_type"}) {
      auto it = rs->find(k);
      if (it != rs->end() && it->is_string()) type = it->get<std::string>();
    }
    if (!type.empty() && type != "yarn" && type != "deepseek_yarn") {
      return config.KeyError(
          "rope_scaling",
          absl::StrCat("type '", type, "' is not supported (yarn only)"));
    }
    RETURN_IF_ERROR(number(*rs, "original_max_position_embeddings",
                           "rope_scaling", 1, 1e9, 0, orig));
    RETURN_IF_ERROR(number(*rs, "factor", "rope_scaling", 1, 1e6, 1, factor));
    RETURN_IF_ERROR(
        number(*rs, "beta_fast", "rope_scaling", 1e-3, 1e6, 32, fast));
    RETURN_IF_ERROR(
        number(*rs, "beta_slow", "rope_scaling", 1e-3, 1e6, 1, slow));
  } else if (config.Find("original_seq_len") != nullptr) {
    const nlohmann::json& root =
        config.has_text_config() &&
                config.root()["text_config"].contains("original_seq_len")
            ? config.root()["text_config"]
            : config.root();
    RETURN_IF_ERROR(
        number(root, "original_seq_len", "original_seq_len", 0, 1e9, 0, orig));
    RETURN_IF_ERROR(
        number(root, "rope_factor", "rope_factor", 1, 1e6, 1, factor));
    RETURN_IF_ERROR(
        number(root, "beta_fast", "beta_fast", 1e-3, 1e6, 32, fast));
    RETURN_IF_ERROR(number(root, "beta_slow", "beta_slow", 1e-3, 1e6, 1, slow));
  }
  y.original_seq_len = static_cast<int64_t>(orig);
  y.factor = static_cast<float>(factor);
  y.beta_fast = static_cast<float>(fast);
  y.beta_slow = static_cast<float>(slow);
  return absl::OkStatus();
}

// The compressed attention keys: ratios, sources, indexers.
absl::Status CheckSparseAttention(const checkpoint::ModelConfig& config,
                                  const ModelDims& d) {
  bool any_indexer = false;
  for (int l = 0; l < d.num_layers; ++l) {
    const int r = d.compress_ratios[l];
    if (r == 0) continue;
    if (d.IsV41()) {
      const int src = d.CacheSource(l);
      if (src < 0) {
        return config.KeyError(
            "kv_source_layer_ids",
            absl::StrCat("layer ", l, " has compress ratio ", r,
                         " but no kv source layer at or before it"));
      }
      if (d.compress_ratios[src] != r) {
        return config.KeyError(
            "compress_ratios",
            absl::StrCat("layer ", l, " (ratio ", r,
                         ") reads the cache of kv source layer ", src,
                         " whose ratio is ", d.compress_ratios[src]));
      }
      // The selection a layer without an indexer reuses must exist.
      bool has_selection = false;
      for (int s : d.index_source_layers) {
        if (s <= l && d.CacheSource(s) == src) has_selection = true;
      }
      if (!has_selection) {
        return config.KeyError(
            "index_source_layer_ids",
            absl::StrCat("layer ", l,
                         " has no index source at or before it that reads "
                         "the same cache (layer ",
                         src, ")"));
      }
    }
    any_indexer = any_indexer || d.HasIndexer(l);
  }
  if (d.IsV41()) {
    for (int s : d.kv_source_layers) {
      if (d.compress_ratios[s] == 0) {
        return config.KeyError(
            "kv_source_layer_ids",
            absl::StrCat("layer ", s, " has compress ratio 0"));
      }
    }
    for (int s : d.index_source_layers) {
      if (d.compress_ratios[s] == 0) {
        return config.KeyError(
            "index_source_layer_ids",
            absl::StrCat("layer ", s, " has compress ratio 0"));
      }
    }
    if (d.candidate_source_layer >= 0) {
      if (!d.HasIndexer(d.candidate_source_layer)) {
        return config.KeyError("candidate_source_layer_id",
                               "must be an index source layer");
      }
      if (d.candidate_topk_blocks < 1 || d.candidate_block_size < 1) {
        return config.KeyError(
            "candidate_topk_blocks",
            "candidate_topk_blocks and candidate_block_size must be >= 1");
      }
      // Every later index source selects among candidates only: enough
      // candidates must be visible whenever index_topk entries are.
      if (int64_t{d.candidate_topk_blocks - 1} * d.candidate_block_size + 1 <
          d.index_topk) {
        return config.KeyError(
            "candidate_topk_blocks",
            absl::StrCat("(candidate_topk_blocks - 1) x candidate_block_size "
                         "+ 1 must be >= index_topk (",
                         d.index_topk, ")"));
      }
    }
  }
  if (any_indexer) {
    if (d.index_heads < 1 || d.index_head_dim < 1 || d.index_topk < 1) {
      return config.KeyError(
          "index_n_heads",
          "index_n_heads, index_head_dim and index_topk must be >= 1 when a "
          "layer has an indexer");
    }
    if (d.index_head_dim > d.head_dim || d.rope_dim > d.index_head_dim) {
      return config.KeyError("index_head_dim",
                             absl::StrCat(d.index_head_dim,
                                          " must lie in [qk_rope_head_dim, "
                                          "head_dim]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* ArchName(Arch arch) {
  return arch == Arch::kV41 ? "deepseek_v41" : "deepseek_v4";
}

bool ModelDims::HasIndexer(int layer) const {
  if (IsV41()) {
    return std::binary_search(index_source_layers.begin(),
                              index_source_layers.end(), layer);
  }
  return compress_ratios[layer] == 4;
}

bool ModelDims::HasCompressor(int layer) const {
  if (IsV41()) {
    return std::binary_search(kv_source_layers.begin(), kv_source_layers.end(),
                              layer);
  }
  return compress_ratios[layer] > 0;
}

int ModelDims::CacheSource(int layer) const {
  if (compress_ratios[layer] == 0) return -1;
  if (!IsV41()) return layer;
  int source = -1;
  for (int s : kv_source_layers) {
    if (s <= layer) source = s;
  }
  return source;
}

std::vector<double> ModelDims::RopeFrequencies(int layer) const {
  const bool compressed = compress_ratios[layer] > 0;
  const double base = compressed ? compress_rope_theta : rope_theta;
  const int dim = rope_dim;
  std::vector<double> freqs(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    freqs[i] = 1.0 / std::pow(base, 2.0 * i / dim);
  }
  if (compressed && yarn.original_seq_len > 0) {
    auto correction_dim = [&](double rotations) {
      return dim * std::log(yarn.original_seq_len / (rotations * 2 * M_PI)) /
             (2 * std::log(base));
    };
    const double low =
        std::max(std::floor(correction_dim(yarn.beta_fast)), 0.0);
    double high =
        std::min(std::ceil(correction_dim(yarn.beta_slow)), dim - 1.0);
    if (low == high) high += 0.001;
    for (int i = 0; i < dim / 2; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double smooth = 1.0 - ramp;
      freqs[i] = freqs[i] / yarn.factor * (1.0 - smooth) + freqs[i] * smooth;
    }
  }
  return freqs;
}

bool ModelDims::IsEngramLayer(int layer) const {
  return std::binary_search(engram_layers.begin(), engram_layers.end(), layer);
}

absl::StatusOr<ModelDims> LoadModelDims(const checkpoint::ModelConfig& config) {
  ModelDims d;
  absl::Status st;
  auto check = [&](absl::Status s) {
    if (st.ok() && !s.ok()) st = std::move(s);
  };
  check(GetIntIn(config, "vocab_size", 1, int64_t{1} << 24, d.vocab_size));
  check(GetIntIn(config, "hidden_size", 1, kMaxDim, d.hidden_size));
  check(GetIntIn(config, "num_hidden_layers", 1, 1024, d.num_layers));
  // Defaults of absent keys are the official ModelArgs'.
  check(GetOptionalIntIn(config, "hc_mult", 2, 16, 4, d.hc_mult));
  check(GetOptionalIntIn(config, "hc_sinkhorn_iters", 1, 1000, 20,
                         d.hc_sinkhorn_iters));
  check(GetOptionalFloat(config, "hc_eps", 0, 1, 1e-6f, d.hc_eps));
  check(GetOptionalFloat(config, "rms_norm_eps", 0, 1, 1e-6f, d.rms_norm_eps));
  check(GetIntIn(config, "num_attention_heads", 1, 4096, d.num_heads));
  check(GetIntIn(config, "head_dim", 2, 65536, d.head_dim));
  check(GetIntIn(config, "qk_rope_head_dim", 0, 65536, d.rope_dim));
  check(
      GetOptionalFloat(config, "rope_theta", 1, 1e12, 10000.0f, d.rope_theta));
  check(GetIntIn(config, "q_lora_rank", 1, kMaxDim, d.q_lora_rank));
  check(GetIntIn(config, "o_lora_rank", 1, kMaxDim, d.o_lora_rank));
  check(GetIntIn(config, "o_groups", 1, 4096, d.o_groups));
  check(GetIntIn(config, "sliding_window", 1, 1 << 20, d.sliding_window));
  check(GetIntIn(config, "n_routed_experts", 1, 65536, d.num_experts));
  check(GetIntIn(config, "num_experts_per_tok", 1, 65536, d.experts_per_token));
  check(GetOptionalIntIn(config, "n_shared_experts", 0, 64, 1,
                         d.num_shared_experts));
  check(GetIntIn(config, "moe_intermediate_size", 1, kMaxDim,
                 d.moe_intermediate));
  check(GetOptionalFloat(config, "routed_scaling_factor", 0, 1e6, 1.0f,
                         d.routed_scaling));
  check(GetOptionalFloat(config, "swiglu_limit", 0, 1e9, 0.0f, d.swiglu_limit));
  int bos = 0, eos = 1;
  check(GetOptionalIntIn(config, "bos_token_id", 0, 1 << 30, 0, bos));
  check(GetOptionalIntIn(config, "eos_token_id", 0, 1 << 30, 1, eos));
  d.bos_token_id = bos;
  d.eos_token_id = eos;
  if (!st.ok()) return st;

  // The architecture.
  if (const nlohmann::json* mt = config.Find("model_type")) {
    const std::string type = mt->is_string() ? mt->get<std::string>() : "";
    if (type == "deepseek_v4") {
      d.arch = Arch::kV4;
    } else if (type == "deepseek_v41" || type == "deepseek_v4.1") {
      d.arch = Arch::kV41;
    } else {
      return config.KeyError(
          "model_type",
          absl::StrCat("'", type,
                       "' is not a supported architecture (deepseek_v4, "
                       "deepseek_v41)"));
    }
  } else {
    d.arch =
        config.Find("kv_source_layer_ids") != nullptr ? Arch::kV41 : Arch::kV4;
  }
  check(GetOptionalIntIn(config, "num_nextn_predict_layers", 0, 64, 0,
                         d.num_draft_layers));
  check(GetOptionalFloat(config, "compress_rope_theta", 1, 1e12, 40000.0f,
                         d.compress_rope_theta));
  check(GetYarn(config, d.yarn));
  check(GetOptionalIntIn(config, "index_n_heads", 0, 4096, 0, d.index_heads));
  check(GetOptionalIntIn(config, "index_head_dim", 0, 65536, 0,
                         d.index_head_dim));
  check(GetOptionalIntIn(config, "index_topk", 0, 1 << 24, 0, d.index_topk));
  check(GetOptionalIntIn(config, "num_hash_layers", 0, 1024, 0,
                         d.num_hash_layers));
  check(GetOptionalIntIn(config, "candidate_source_layer_id", -1, 1023, -1,
                         d.candidate_source_layer));
  check(GetOptionalIntIn(config, "candidate_topk_blocks", 0, 1 << 24, 0,
                         d.candidate_topk_blocks));
  check(GetOptionalIntIn(config, "candidate_block_size", 0, 1 << 20, 0,
                         d.candidate_block_size));
  check(GetOptionalIntIn(config, "dspark_block_size", 0, 64, 0,
                         d.dspark_block_size));
  check(GetOptionalIntIn(config, "dspark_markov_rank", 0, kMaxDim, 0,
                         d.dspark_markov_rank));
  check(GetOptionalIntIn(config, "dspark_noise_token_id", 0,
                         std::max<int64_t>(d.vocab_size - 1, 0), 0,
                         d.dspark_noise_token));
  check(GetOptionalIntIn(config, "dspark_n_routed_experts", 0, 65536, 0,
                         d.draft_num_experts));
  check(GetOptionalIntIn(config, "dspark_num_experts_per_tok", 0, 65536, 0,
                         d.draft_experts_per_token));
  check(GetLayerList(config, "kv_source_layer_ids", d.num_layers,
                     d.kv_source_layers));
  check(GetLayerList(config, "index_source_layer_ids", d.num_layers,
                     d.index_source_layers));
  check(GetLayerList(config, "dspark_target_layer_ids", d.num_layers,
                     d.dspark_target_layers));
  if (!st.ok()) return st;
  // The V4.1 gate divides its logits by gate_temp; the releases use 1.
  float gate_temp = 1.0f;
  RETURN_IF_ERROR(
      GetOptionalFloat(config, "gate_temp", 1e-6, 1e6, 1.0f, gate_temp));
  if (gate_temp != 1.0f) {
    return config.KeyError("gate_temp",
                           absl::StrCat(gate_temp, ": only 1 is supported"));
  }
  if (const nlohmann::json* n = config.Find("norm_topk_prob");
      n != nullptr && d.IsV41() && !(n->is_boolean() && n->get<bool>())) {
    return config.KeyError("norm_topk_prob",
                           "only true (the releases') is supported");
  }
  if (const nlohmann::json* s = config.Find("scoring_func")) {
    if (!s->is_string() || s->get<std::string>() != "sqrtsoftplus") {
      return config.KeyError("scoring_func",
                             "only sqrtsoftplus (the releases') is supported");
    }
  }
  if (d.draft_num_experts == 0) d.draft_num_experts = d.num_experts;
  if (d.draft_experts_per_token == 0) {
    d.draft_experts_per_token = d.experts_per_token;
  }
  if (d.IsV41() && config.Find("num_hash_layers") != nullptr &&
      d.num_hash_layers != 0) {
    return config.KeyError("num_hash_layers",
                           "DeepSeek-V4.1 has no hash-routed layers");
  }
  if (d.num_hash_layers > d.num_layers) {
    return config.KeyError("num_hash_layers",
                           absl::StrCat(d.num_hash_layers, " exceeds the ",
                                        d.num_layers, " layers"));
  }

  // compress_ratios: one non-negative integer per layer and per draft
  // layer (absent: all 0). The draft layers are counted from the list: the
  // V4-Flash-0731 release writes num_nextn_predict_layers 1 next to three
  // DSpark stages.
  if (const nlohmann::json* cr = config.Find("compress_ratios");
      cr != nullptr && cr->is_array() &&
      static_cast<int>(cr->size()) > d.num_layers + d.num_draft_layers &&
      d.dspark_block_size > 0) {
    d.num_draft_layers = static_cast<int>(cr->size()) - d.num_layers;
  }
  const int total_layers = d.num_layers + d.num_draft_layers;
  d.compress_ratios.assign(d.num_layers, 0);
  d.draft_compress_ratios.assign(d.num_draft_layers, 0);
  if (const nlohmann::json* cr = config.Find("compress_ratios")) {
    if (!cr->is_array() || static_cast<int>(cr->size()) != total_layers) {
      return config.KeyError(
          "compress_ratios",
          absl::StrCat(
              "must be a list of ", total_layers,
              " integers (one per layer, num_hidden_layers = ", d.num_layers,
              ", then one per draft layer, ", d.num_draft_layers, ")"));
    }
    for (int i = 0; i < total_layers; ++i) {
      const nlohmann::json& v = (*cr)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() > 4096) {
        return config.KeyError(
            "compress_ratios",
            absl::StrCat("entry ", i, " must be an integer in [0, 4096]"));
      }
      (i < d.num_layers ? d.compress_ratios[i]
                        : d.draft_compress_ratios[i - d.num_layers]) =
          v.get<int>();
    }
  }
  for (int i = 0; i < d.num_draft_layers; ++i) {
    if (d.draft_compress_ratios[i] != 0) {
      return config.KeyError(
          "compress_ratios",
          absl::StrCat("entry ", d.num_layers + i,
                       " (a draft layer) must be 0: draft layers attend "
                       "their window only"));
    }
  }
  // Engram layers.
  if (const nlohmann::json* el = config.Find("engram_layer_ids")) {
    if (!el->is_array()) {
      return config.KeyError("engram_layer_ids", "must be a list");
    }
    for (const nlohmann::json& v : *el) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= d.num_layers) {
        return config.KeyError(
            "engram_layer_ids",
            absl::StrCat("every entry must be a layer in [0, ", d.num_layers,
                         ")"));
      }
      d.engram_layers.push_back(v.get<int>());
    }
    std::sort(d.engram_layers.begin(), d.engram_layers.end());
    if (std::adjacent_find(d.engram_layers.begin(), d.engram_layers.end()) !=
        d.engram_layers.end()) {
      return config.KeyError("engram_layer_ids", "repeats a layer");
    }
  }
  // FP8 block size: quantization_config.weight_block_size (top level or in
  // text_config); without it the architecture's (the official code's
  // block_size: V4 128, V4.1 32).
  d.fp8_block_rows = d.fp8_block_cols = d.IsV41() ? 32 : 128;
  // V4.1's norm eps is 1e-20 unless the config says otherwise.
  if (d.IsV41() && config.Find("rms_norm_eps") == nullptr) {
    d.rms_norm_eps = 1e-20f;
  }
  if (const nlohmann::json* qc = config.Find("quantization_config")) {
    const nlohmann::json& q = *qc;
    if (!q.is_object()) {
      return config.KeyError("quantization_config", "must be an object");
    }
    // An EXL3 conversion keeps the release's config (and its FP8 block
    // size, for the modules it left in FP8) under
    // original_quantization_config.
    const nlohmann::json* blocks = &q;
    if (!q.contains("weight_block_size")) {
      if (auto o = q.find("original_quantization_config");
          o != q.end() && o->is_object()) {
        blocks = &*o;
      }
    }
    if (auto b = blocks->find("weight_block_size"); b != blocks->end()) {
      if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
          !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() < 1 ||
          (*b)[1].get<int64_t>() < 1 || (*b)[0].get<int64_t>() > 4096 ||
          (*b)[1].get<int64_t>() > 4096) {
        return config.KeyError(
            "quantization_config",
            "weight_block_size must be two integers in [1, 4096]");
      }
      d.fp8_block_rows = (*b)[0].get<int>();
      d.fp8_block_cols = (*b)[1].get<int>();
    }
  }

  // Consistency.
  if (d.rope_dim % 2 != 0 || d.rope_dim > d.head_dim) {
    return config.KeyError(
        "qk_rope_head_dim",
        absl::StrCat(d.rope_dim, " must be even and at most head_dim (",
                     d.head_dim, ")"));
  }
  if (d.num_heads % d.o_groups != 0) {
    return config.KeyError("o_groups",
                           absl::StrCat(d.o_groups, " does not divide the ",
                                        d.num_heads, " attention heads"));
  }
  if (d.experts_per_token > d.num_experts) {
    return config.KeyError(
        "num_experts_per_tok",
        absl::StrCat(d.experts_per_token, " exceeds n_routed_experts (",
                     d.num_experts, ")"));
  }
  if (d.draft_experts_per_token > d.draft_num_experts) {
    return config.KeyError("dspark_num_experts_per_tok",
                           "exceeds the draft layers' routed experts");
  }
  if (d.num_shared_experts != 1) {
    return config.KeyError(
        "n_shared_experts",
        absl::StrCat(d.num_shared_experts,
                     ": the released architectures have one shared expert"));
  }
  RETURN_IF_ERROR(CheckSparseAttention(config, d));
  return d;
}

absl::Status CheckTensorParallel(const ModelDims& dims, int tp_size) {
  if (tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", tp_size, " must be >= 1"));
  }
  auto divides = [&](int64_t n, const char* what) -> absl::Status {
    if (n % tp_size == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", tp_size, " does not divide the ",
                     n, " ", what));
  };
  RETURN_IF_ERROR(divides(dims.num_heads, "attention heads"));
  RETURN_IF_ERROR(divides(dims.o_groups, "output head groups (o_groups)"));
  if (dims.index_heads > 0) {
    RETURN_IF_ERROR(divides(dims.index_heads, "indexer heads"));
  }
  return divides(dims.num_experts, "routed experts");
}

}  // namespace mneme::model
