"""Tiny random checkpoints in the real DeepSeek-V4-Flash / V4.1-Flash
layouts (names, dtypes, shape relations, block sizes), written with numpy
for the reference's own tests. Configs: the agreed tiny configs (V4: 5
layers, ratios [0,0,4,128,4,0]; V4.1: 9 layers, kv sources [2,4,6], index
sources [2,4,6,8], candidate source 6, Engram layers [1,3])."""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_format as sf  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "..", "engram_store", "hashing"))
from reference_row_ids import find_next_prime  # noqa: E402

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
            "<｜▁pad▁｜>"]
WORDS = ["the", "The", "THE", "Ġthe", "ĠThe", "ing", "Ġa", "ĠA", "er", "Ġis",
         "Ġof", "Ġto", "Ġand", "ĠAnd", "Ġin", "ĠIn", "on", "Ġon", "ĠOn",
         "ed", "Ġit", "ĠIt", "Ġhe", "ĠHe", "Ġwas", "ĠWas", "ĠĠ", "ĠĠĠ",
         "ĊĊ", "Ġ(", "Ġ)", "Ġ=", "Ġ==", "cafÃ©", "Ġcafe", "Ġcat", "ĠCat",
         "Ġdog", "ĠDog", "Ġx", "ĠX"]


def _byte_chars():
    bs = (list(range(ord("!"), ord("~") + 1))
          + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def tokenizer_json(vocab_size):
    """A byte-level BPE tokenizer.json: 3 special tokens, the 256 byte
    tokens, a few words, then filler words up to vocab_size."""
    tokens = _byte_chars() + WORDS
    k = 0
    while len(tokens) + len(SPECIALS) < vocab_size:
        tokens.append("Ġw" + "abcdefghij"[k % 10] + str(k))
        k += 1
    vocab = {t: i + len(SPECIALS) for i, t in enumerate(tokens)}
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, s in enumerate(SPECIALS)]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                        "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}}


V4_CONFIG = {
    "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
    "hidden_size": 256, "num_hidden_layers": 5, "num_attention_heads": 8,
    "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
    "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 2,
    "sliding_window": 16, "compress_ratios": [0, 0, 4, 128, 4, 0],
    "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16,
                     "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 1048576, "index_n_heads": 8,
    "index_head_dim": 128, "index_topk": 16, "n_routed_experts": 16,
    "num_experts_per_tok": 6, "n_shared_experts": 1,
    "moe_intermediate_size": 128, "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
    "norm_topk_prob": True, "num_hash_layers": 3, "swiglu_limit": 10.0,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                            "activation_scheme": "dynamic",
                            "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128]},
    "expert_dtype": "fp4", "bos_token_id": 0, "eos_token_id": 1,
    "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "attention_bias": False,
}

V41_TEXT = {
    "model_type": "deepseek_v41", "hidden_size": 256,
    "num_hidden_layers": 9, "num_attention_heads": 8, "head_dim": 128,
    "qk_rope_head_dim": 64, "q_lora_rank": 128, "o_lora_rank": 64,
    "o_groups": 2, "sliding_window": 16,
    "compress_ratios": [0, 0, 2, 2, 2, 2, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [2, 4, 6], "index_source_layer_ids": [2, 4, 6, 8],
    "candidate_source_layer_id": 6, "candidate_topk_blocks": 8,
    "candidate_block_size": 4, "index_n_heads": 4, "index_head_dim": 128,
    "index_topk": 16, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": dict(V4_CONFIG["rope_scaling"]),
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-20,
    "n_routed_experts": 16, "num_experts_per_tok": 6, "n_shared_experts": 1,
    "moe_intermediate_size": 128, "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "norm_topk_prob": True,
    "engram_layer_ids": [1, 3], "engram_max_ngram_size": 4,
    "engram_n_heads": 8, "engram_head_dim": 256, "engram_vocab_size": 211,
    "engram_pad_token_id": 2, "num_nextn_predict_layers": 3,
    "dspark_block_size": 5, "dspark_noise_token_id": 5,
    "dspark_target_layer_ids": [6, 7, 8], "dspark_markov_rank": 32,
    "dspark_n_routed_experts": 8, "dspark_num_experts_per_tok": 3,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                            "scale_fmt": "ue8m0",
                            "weight_block_size": [32, 32],
                            "expert_dtype": "fp4"},
    "bos_token_id": 0, "eos_token_id": 1,
}


class Writer:
    def __init__(self, seed, block):
        self.rng = np.random.default_rng(seed)
        self.block = block
        self.tensors = []

    def n(self, shape, std):
        return self.rng.standard_normal(shape) * std

    def bf16(self, name, x):
        self.tensors.append((name, "BF16", sf.bf16_bits(x)))

    def f32(self, name, x):
        self.tensors.append((name, "F32", np.asarray(x, np.float32)))

    def i64(self, name, x):
        self.tensors.append((name, "I64", np.asarray(x, np.int64)))

    def fp8(self, prefix, out, inp, mult=1.0):
        q, s = sf.quant_fp8(self.n((out, inp), mult / np.sqrt(inp)),
                            self.block)
        self.tensors.append((prefix + ".weight", "F8_E4M3", q))
        self.tensors.append((prefix + ".scale", "F8_E8M0", s))

    def fp4(self, prefix, out, inp, mult=1.0):
        q, s = sf.quant_mxfp4(self.n((out, inp), mult / np.sqrt(inp)))
        self.tensors.append((prefix + ".weight", "I8", q))
        self.tensors.append((prefix + ".scale", "F8_E8M0", s))

    def norm(self, name, dim):
        self.bf16(name, 1.0 + self.n(dim, 0.1))


def _block(w, pre, c, layer, m, experts, topk, hashed, v41, kv_src=False,
           idx_src=False):
    d, H, D = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    ql, R, G = c["q_lora_rank"], c["o_lora_rank"], c["o_groups"]
    I = c["moe_intermediate_size"]
    hc = c["hc_mult"]
    mix = (2 + hc) * hc
    w.norm(pre + "attn_norm.weight", d)
    w.norm(pre + "ffn_norm.weight", d)
    for site in ("attn", "ffn"):
        w.f32(f"{pre}hc_{site}_fn", w.n((mix, hc * d), 1.0 / np.sqrt(hc * d)))
        base = w.n(mix, 0.3)
        base[2 * hc:] += 2.0 * np.eye(hc).reshape(-1)  # comb near identity
        w.f32(f"{pre}hc_{site}_base", base)
        w.f32(f"{pre}hc_{site}_scale", 0.5 + 0.5 * w.rng.random(3))
    w.f32(pre + "attn.attn_sink", w.n(H, 1.0))
    w.fp8(pre + "attn.wq_a", ql, d)
    w.norm(pre + "attn.q_norm.weight", ql)
    w.fp8(pre + "attn.wq_b", H * D, ql)
    w.fp8(pre + "attn.wkv", D, d)
    w.norm(pre + "attn.kv_norm.weight", D)
    w.fp8(pre + "attn.wo_a", G * R, H * D // G)
    w.fp8(pre + "attn.wo_b", d, G * R)
    nI, dI = c["index_n_heads"], c["index_head_dim"]
    if not v41 and m:
        cc = 2 if m == 4 else 1
        cp = pre + "attn.compressor."
        w.f32(cp + "ape", w.n((m, cc * D), 0.3))
        w.bf16(cp + "wkv.weight", w.n((cc * D, d), 1 / np.sqrt(d)))
        w.bf16(cp + "wgate.weight", w.n((cc * D, d), 1 / np.sqrt(d)))
        w.norm(cp + "norm.weight", D)
        if m == 4:
            ip = pre + "attn.indexer."
            w.fp8(ip + "wq_b", nI * dI, ql)
            w.bf16(ip + "weights_proj.weight", w.n((nI, d), 1 / np.sqrt(d)))
            w.f32(ip + "compressor.ape", w.n((m, 2 * dI), 0.3))
            w.bf16(ip + "compressor.wkv.weight",
                   w.n((2 * dI, d), 1 / np.sqrt(d)))
            w.bf16(ip + "compressor.wgate.weight",
                   w.n((2 * dI, d), 1 / np.sqrt(d)))
            w.norm(ip + "compressor.norm.weight", dI)
    if v41:
        cp = pre + "attn.compressor."
        ip = pre + "attn.indexer."
        if kv_src:
            w.bf16(cp + "wkv.weight", w.n((D, d), 1 / np.sqrt(d)))
            if m > 1:
                w.bf16(cp + "wgate.weight", w.n((D, d), 1 / np.sqrt(d)))
            w.norm(cp + "norm.weight", D)
            w.bf16(ip + "wk.weight", w.n((dI, D), 1 / np.sqrt(D)))
            w.norm(ip + "k_norm.weight", dI)
        if idx_src:
            w.fp8(ip + "wq_b", nI * dI, ql)
            w.bf16(ip + "weights_proj.weight", w.n((nI, d), 1 / np.sqrt(d)))
    w.bf16(pre + "ffn.gate.weight", w.n((experts, d), 1 / np.sqrt(d)))
    if hashed:
        V = c["vocab_size"]
        w.i64(pre + "ffn.gate.tid2eid",
              np.stack([w.rng.permutation(experts)[:topk] for _ in range(V)]))
    else:
        w.f32(pre + "ffn.gate.bias", w.n(experts, 0.1))
        if v41:
            w.f32(pre + "ffn.gate.bias_vl", w.n(experts, 0.1))
    for e in range(experts):
        mult = 4.0 if e % 8 == 3 else 1.0
        w.fp4(f"{pre}ffn.experts.{e}.w1", I, d, mult)
        w.fp4(f"{pre}ffn.experts.{e}.w3", I, d, mult)
        w.fp4(f"{pre}ffn.experts.{e}.w2", d, I)
    w.fp8(pre + "ffn.shared_experts.w1", I, d)
    w.fp8(pre + "ffn.shared_experts.w3", I, d)
    w.fp8(pre + "ffn.shared_experts.w2", d, I)


def _write_shards(out_dir, tensors, shards=3):
    weight_map = {}
    per = (len(tensors) + shards - 1) // shards
    total = 0
    for s in range(shards):
        part = tensors[s * per:(s + 1) * per]
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        total += sf.write_safetensors(os.path.join(out_dir, name), part)
        for t in part:
            weight_map[t[0]] = name
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": weight_map}, f, indent=1)


def _engram_table(w, pre, rows, hd, seed, fmt):
    """Table rows e2m1 * 2^s (s per 16 values in -3..0), so that the FP8
    (E4M3 + E8M0 per 32) and the NVFP4 (E2M1 + E4M3 per 16 + global 0.5)
    encodings hold exactly the same values."""
    rng = np.random.default_rng(seed)
    nib = rng.integers(0, 16, (rows, hd)).astype(np.uint8)
    s16 = rng.integers(-3, 1, (rows, hd // 16))
    if fmt == "fp8":
        s32 = s16.reshape(rows, hd // 32, 2).max(-1)
        vals = sf.E2M1[nib] * 2.0 ** (np.repeat(s16, 16, 1)
                                     - np.repeat(s32, 32, 1))
        q = sf.e4m3_bits(vals)
        if not np.array_equal(sf.E4M3[q], vals):
            raise AssertionError("fp8 table values not exact")
        w.tensors.append((pre + "embed.weight", "F8_E4M3", q))
        w.tensors.append((pre + "embed.scale", "F8_E8M0",
                          (s32 + 127).astype(np.uint8)))
    elif fmt == "nvfp4":
        packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
        w.tensors.append((pre + "embed.weight", "U8", packed))
        w.tensors.append((pre + "embed.scale", "F8_E4M3",
                          sf.e4m3_bits(2.0 ** (s16 + 1))))
    else:
        raise ValueError(fmt)


def write_tiny(out_dir, arch, seed=0, vocab_size=320, engram_format="fp8"):
    """Writes a tiny checkpoint; arch is "v4-flash" or "v4.1-flash";
    engram_format "fp8" or "nvfp4" (V4.1 tables)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(vocab_size), f)
    if arch == "v4-flash":
        c = dict(V4_CONFIG, vocab_size=vocab_size)
        w = Writer(seed, (128, 128))
        v41 = False
    elif arch == "v4.1-flash":
        c = dict(V41_TEXT, vocab_size=vocab_size)
        w = Writer(seed, (32, 32))
        v41 = True
    else:
        raise ValueError(arch)
    d, V = c["hidden_size"], vocab_size
    hc = c["hc_mult"]
    w.bf16("embed.weight", w.n((V, d), 1.0))
    w.bf16("head.weight", w.n((V, d), 2.0 / np.sqrt(d)))
    w.norm("norm.weight", d)
    L = c["num_hidden_layers"]
    E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    if not v41:
        w.f32("hc_head_fn", w.n((hc, hc * d), 1.0 / np.sqrt(hc * d)))
        w.f32("hc_head_base", w.n(hc, 0.3))
        w.f32("hc_head_scale", [0.7])
        for i in range(L):
            _block(w, f"layers.{i}.", c, i, c["compress_ratios"][i], E, k,
                   i < c["num_hash_layers"], False)
        mp = "mtp.0."
        _block(w, mp, c, L, 0, E, k, False, False)
        w.fp8(mp + "e_proj", d, d)
        w.fp8(mp + "h_proj", d, d)
        for n in ("enorm", "hnorm", "norm"):
            w.norm(mp + n + ".weight", d)
        w.f32(mp + "hc_head_fn", w.n((hc, hc * d), 1.0 / np.sqrt(hc * d)))
        w.f32(mp + "hc_head_base", w.n(hc, 0.3))
        w.f32(mp + "hc_head_scale", [0.7])
        config = c
    else:
        for n in ("image_start", "image_end", "image_newline"):
            w.bf16(n, w.n(d, 1.0))
        for i in range(L):
            _block(w, f"layers.{i}.", c, i, c["compress_ratios"][i], E, k,
                   False, True, i in c["kv_source_layer_ids"],
                   i in c["index_source_layer_ids"])
        De, Ke = c["dspark_n_routed_experts"], c["dspark_num_experts_per_tok"]
        for s in range(c["num_nextn_predict_layers"]):
            _block(w, f"mtp.{s}.", c, L + s, 0, De, Ke, False, True)
        ntarget = len(c["dspark_target_layer_ids"])
        w.fp8("mtp.0.main_proj", d, d * ntarget)
        w.norm("mtp.0.main_norm.weight", d)
        last = f"mtp.{c['num_nextn_predict_layers'] - 1}."
        w.norm(last + "norm.weight", d)
        r = c["dspark_markov_rank"]
        w.bf16(last + "markov_head.embed.weight", w.n((V, r), 1.0))
        w.bf16(last + "markov_head.head.weight", w.n((V, r), 1 / np.sqrt(r)))
        w.bf16(last + "confidence_head.proj.weight",
               w.n((1, d + r), 1 / np.sqrt(d + r)))
        # Engram: compressed vocabulary size, primes, tables, wkv.
        sys.path.insert(0, HERE)
        from deepseek_reference import compressed_lookup
        lookup = compressed_lookup(os.path.join(out_dir, "tokenizer.json"))
        c["engram_compressed_vocab_size"] = len(set(lookup))
        seen = set()
        nums = []
        hd = c["engram_head_dim"]
        ncol = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
        for layer in c["engram_layer_ids"]:
            total = 0
            for _ in range(c["engram_max_ngram_size"] - 1):
                cur = c["engram_vocab_size"] - 1
                for _ in range(c["engram_n_heads"]):
                    cur = find_next_prime(cur, seen)
                    seen.add(cur)
                    total += cur
            nums.append(total)
            pre = f"layers.{layer}.engram."
            _engram_table(w, pre, total, hd, seed * 1000 + layer,
                          engram_format)
            w.fp8(pre + "wkv", (hc + 1) * d, ncol * hd)
            w.bf16(pre + "q_weight", 1.0 + w.n((hc, d), 0.2))
            w.bf16(pre + "k_weight", 1.0 + w.n((hc, d), 0.2))
        c["engram_num_embeddings"] = nums
        if engram_format == "nvfp4":
            c["engram_quant"] = "nvfp4"
            c["engram_quant_block_size"] = 16
            c["engram_quant_method"] = "rtn-amax"
            c["engram_quant_global_scale"] = {
                str(layer): 0.5 for layer in c["engram_layer_ids"]}
        config = {"model_type": "deepseek_v41",
                  "architectures": ["DeepseekV41ForCausalLM"],
                  "text_config": c, "vision_config": {},
                  "torch_dtype": "bfloat16"}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    _write_shards(out_dir, w.tensors)
    return out_dir


if __name__ == "__main__":
    write_tiny(sys.argv[1], sys.argv[2])
