#include "model/model_config.h"

#include <algorithm>
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

}  // namespace

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
  check(GetOptionalIntIn(config, "hc_mult", 1, 16, 1, d.hc_mult));
  check(GetOptionalIntIn(config, "hc_sinkhorn_iters", 0, 1000, 20,
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
  check(GetOptionalIntIn(config, "n_shared_experts", 0, 64, 0,
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

  // compress_ratios: one non-negative integer per layer (absent: all 0).
  d.compress_ratios.assign(d.num_layers, 0);
  if (const nlohmann::json* cr = config.Find("compress_ratios")) {
    if (!cr->is_array() || static_cast<int>(cr->size()) != d.num_layers) {
      return config.KeyError("compress_ratios",
                             absl::StrCat("must be a list of ", d.num_layers,
                                          " integers (one per layer)"));
    }
    for (int i = 0; i < d.num_layers; ++i) {
      const nlohmann::json& v = (*cr)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() > 4096) {
        return config.KeyError(
            "compress_ratios",
            absl::StrCat("entry ", i, " must be an integer in [0, 4096]"));
      }
      d.compress_ratios[i] = v.get<int>();
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
  // FP8 block size: quantization_config.weight_block_size (top level).
  if (auto it = config.root().find("quantization_config");
      it != config.root().end()) {
    const nlohmann::json& q = *it;
    if (!q.is_object()) {
      return config.KeyError("quantization_config", "must be an object");
    }
    if (auto b = q.find("weight_block_size"); b != q.end()) {
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
  return divides(dims.num_experts, "routed experts");
}

}  // namespace mneme::model
