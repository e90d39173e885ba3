#!/usr/bin/env python3
"""Independent float64 reference of the DeepSeek-V4-Flash and V4.1-Flash
forward passes (test-only), written from the official inference code:

- V4:   DeepSeek-V4 `inference/model.py` (copy:
        Nicooo-Wang/DeepSeek-V4-Pro-code @2074660, whose forward code equals
        @0ec3a03; cited [P:line]) and the kernel semantics of
        ../shared/docs/MODEL_V4.md section 4 (sparse_attn, hc_split_sinkhorn).
- V4.1: DeepSeek-V4.1-Flash `inference/model.py` and `engram.py` (vendored in
        tenstorrent/tt-metal models/demos/deepseek_v3_d_p/reference/
        deepseek_v41, cited [Q:function]).

Semantics: the official code in float64 with every quantization (act_quant,
fp4_act_quant, the fp8 KV simulation, bf16 casts) replaced by the identity;
the weights are dequantized exactly.

Usage:
  deepseek_reference.py --checkpoint DIR --tokens 1,2,3 [--greedy N]
      [--logits-positions 0,5] --out FILE.json
Output JSON: model_type, tokens, prompt_logprobs (null at position 0, then
the log-softmax logprob of token p given tokens < p), last_argmax, greedy
(N greedy tokens, each from a fresh prefill of the extended sequence) and
logits {position: [vocab floats]} for the chosen positions.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_format  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ENGRAM_HASHING = os.path.join(HERE, "..", "..", "engram_store", "hashing")

# ---------------------------------------------------------------------------
# Config: HF names (top level for deepseek_v4, text_config for deepseek_v41)
# and the inference names ([P:36-95], [Q:ModelArgs]).

HF_TO_REF = {
    "hidden_size": "dim", "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads", "qk_rope_head_dim": "rope_head_dim",
    "sliding_window": "window_size", "rms_norm_eps": "norm_eps",
    "num_experts_per_tok": "n_activated_experts",
    "moe_intermediate_size": "moe_inter_dim",
    "routed_scaling_factor": "route_scale", "scoring_func": "score_func",
    "num_hash_layers": "n_hash_layers",
    "num_nextn_predict_layers": "n_mtp_layers",
    "kv_source_layer_ids": "kv_source_layers",
    "index_source_layer_ids": "index_source_layers",
    "candidate_source_layer_id": "candidate_source_layer",
    "engram_pad_token_id": "engram_pad_id",
    "dspark_num_experts_per_tok": "dspark_n_activated_experts",
}

DEFAULTS = {
    "n_hash_layers": 0, "score_func": "sqrtsoftplus", "route_scale": 1.0,
    "swiglu_limit": 0.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "n_shared_experts": 1, "gate_temp": 1.0,
    "norm_topk_prob": True, "candidate_source_layer": -1,
    "candidate_topk_blocks": 0, "candidate_block_size": 0,
    "kv_source_layers": [], "index_source_layers": [], "original_seq_len": 0,
    "rope_factor": 1.0, "beta_fast": 32, "beta_slow": 1,
    "engram_layer_ids": [], "engram_pad_id": 2,
    "dspark_block_size": 0, "dspark_target_layer_ids": [],
    "dspark_noise_token_id": 0, "dspark_n_activated_experts": 0,
    "n_mtp_layers": 0,
}


class Config:
    def __init__(self, raw):
        top = dict(raw)
        text = top.get("text_config")
        model_type = top.get("model_type")
        merged = {}
        if isinstance(text, dict):
            merged.update(text)
            model_type = text.get("model_type", model_type)
        for k, v in top.items():
            if k != "text_config":
                merged.setdefault(k, v)
        c = dict(DEFAULTS)
        for k, v in merged.items():
            c[HF_TO_REF.get(k, k)] = v
        rs = merged.get("rope_scaling") or {}
        if rs:
            c["rope_factor"] = rs.get("factor", c["rope_factor"])
            c["original_seq_len"] = rs.get(
                "original_max_position_embeddings", c["original_seq_len"])
            c["beta_fast"] = rs.get("beta_fast", c["beta_fast"])
            c["beta_slow"] = rs.get("beta_slow", c["beta_slow"])
        if model_type is None:
            model_type = ("deepseek_v41" if c.get("kv_source_layers")
                          else "deepseek_v4")
        if model_type not in ("deepseek_v4", "deepseek_v41"):
            raise ValueError(f"unsupported model_type {model_type}")
        self.model_type = model_type
        self.v41 = model_type == "deepseek_v41"
        q = merged.get("quantization_config") or {}
        block = q.get("weight_block_size") or ([32, 32] if self.v41
                                               else [128, 128])
        c["block"] = tuple(int(b) for b in block)
        for k, v in c.items():
            setattr(self, k, v)
        need = ["dim", "n_layers", "n_heads", "head_dim", "rope_head_dim",
                "q_lora_rank", "o_lora_rank", "o_groups", "window_size",
                "compress_ratios", "vocab_size", "n_routed_experts",
                "n_activated_experts", "norm_eps", "rope_theta",
                "compress_rope_theta"]
        for k in need:
            if not hasattr(self, k):
                raise ValueError(f"config lacks {k}")
        if len(self.compress_ratios) < self.n_layers:
            raise ValueError("compress_ratios shorter than n_layers")
        if self.n_shared_experts != 1:
            raise ValueError("the official code asserts 1 shared expert")


# ---------------------------------------------------------------------------
# Small numeric helpers.


def rms(x, w, eps):
    """RMSNorm [P:198-211]: x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def silu(x):
    return x * sigmoid(x)


def softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


# Per query position, the smallest relative gap between the k-th and the
# (k+1)-th score of any top-k taken for that position (indexer, candidate
# blocks, MoE gate) while it is a numpy array; None = not collected. A gap
# below what fp32 arithmetic resolves (~1e-6) makes the selection, and so
# the logits there, ambiguous for an fp32 engine.
_GAPS = None


def _record_gaps(scores, k):
    if _GAPS is None or scores.ndim != 2 or scores.shape[0] != len(_GAPS):
        return
    n = scores.shape[1]
    if k <= 0 or k >= n:
        return
    part = -np.sort(-scores, axis=-1)
    kth, nxt = part[:, k - 1], part[:, k]
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = np.where(np.isfinite(nxt) & np.isfinite(kth),
                       np.abs(kth - nxt) / np.maximum(np.abs(kth), 1e-30),
                       np.inf)
    np.minimum(_GAPS, gap, out=_GAPS)


def topk_lower_first(scores, k):
    """Indices of the k largest along the last axis; ties -> lower index
    first (a stable sort of -score)."""
    _record_gaps(scores, k)
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


def logits_with_gaps(model, tokens):
    """model.logits(tokens) and the per-position selection gaps."""
    global _GAPS
    _GAPS = np.full(len(tokens), np.inf)
    try:
        logits = model.logits(tokens)
        return logits, _GAPS.copy()
    finally:
        _GAPS = None


def hadamard(n):
    """Sylvester Walsh-Hadamard matrix scaled by n^-0.5 (rotate_activation,
    [P:262-272])."""
    if n & (n - 1):
        raise ValueError("Hadamard size must be a power of two")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def rope_freqs(rd, base, yarn, cfg):
    """precompute_freqs_cis [P:215-244], in float64: the frequencies."""
    freqs = 1.0 / (base ** (np.arange(0, rd, 2, dtype=np.float64) / rd))
    if yarn and cfg.original_seq_len > 0:
        def corr(rot):
            return rd * np.log(cfg.original_seq_len / (rot * 2 * np.pi)) / (
                2 * np.log(base))
        low = max(int(np.floor(corr(cfg.beta_fast))), 0)
        high = min(int(np.ceil(corr(cfg.beta_slow))), rd - 1)
        hi = high + 0.001 if low == high else high
        ramp = np.clip((np.arange(rd // 2) - low) / (hi - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    return freqs


def rope(x, pos, freqs, inverse=False):
    """apply_rotary_emb [P:247-259] on the last 2*len(freqs) dims of x,
    adjacent pairs as complex numbers. x: [T, ..., D], pos: [T]."""
    rd = 2 * len(freqs)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * freqs[None, :]
    shape = (ang.shape[0],) + (1,) * (x.ndim - 2) + (ang.shape[1],)
    c = np.cos(ang).reshape(shape)
    s = np.sin(ang).reshape(shape)
    if inverse:
        s = -s
    y = x.copy()
    a = x[..., x.shape[-1] - rd::2]
    b = x[..., x.shape[-1] - rd + 1::2]
    y[..., x.shape[-1] - rd::2] = a * c - b * s
    y[..., x.shape[-1] - rd + 1::2] = a * s + b * c
    return y


# ---------------------------------------------------------------------------
# The model.


class Model:
    def __init__(self, checkpoint_dir):
        self.ckpt = st_format.Checkpoint(checkpoint_dir)
        self.cfg = Config(self.ckpt.config)
        self.dir = checkpoint_dir
        self._cache = {}
        c = self.cfg
        self.freqs = {}
        for i in range(c.n_layers):
            m = c.compress_ratios[i]
            # [P:494-500]: YaRN and compress_rope_theta only when m > 0.
            if m:
                self.freqs[i] = rope_freqs(c.rope_head_dim,
                                           c.compress_rope_theta, True, c)
            else:
                self.freqs[i] = rope_freqs(c.rope_head_dim, c.rope_theta,
                                           False, c)
        self._engram = None

    # weights --------------------------------------------------------------
    def W(self, prefix):
        key = ("W", prefix)
        if key not in self._cache:
            self._cache[key] = self.ckpt.linear(prefix, self.cfg.block)
        return self._cache[key]

    def V(self, name):
        key = ("V", name)
        if key not in self._cache:
            self._cache[key] = self.ckpt.tensor(name)
        return self._cache[key]

    # mHC ------------------------------------------------------------------
    def hc_mixes(self, X, pre, site):
        """hc_pre's mixes + hc_split_sinkhorn [P:699-707]; X [T, hc, d].
        Returns pre [T, hc], post [T, hc], comb [T, hc, hc]."""
        c = self.cfg
        hc = c.hc_mult
        fn = self.V(f"{pre}hc_{site}_fn")
        scale = self.V(f"{pre}hc_{site}_scale")
        base = self.V(f"{pre}hc_{site}_base")
        flat = X.reshape(X.shape[0], -1)
        r = 1.0 / np.sqrt(np.mean(flat * flat, -1, keepdims=True) + c.norm_eps)
        mixes = (flat @ fn.T) * r
        pre_w = sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + c.hc_eps
        post = 2.0 * sigmoid(mixes[:, hc:2 * hc] * scale[1]
                             + base[hc:2 * hc])
        comb = (mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(
            -1, hc, hc)
        comb = softmax(comb, -1) + c.hc_eps
        comb = comb / (comb.sum(-2, keepdims=True) + c.hc_eps)
        for _ in range(c.hc_sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdims=True) + c.hc_eps)
            comb = comb / (comb.sum(-2, keepdims=True) + c.hc_eps)
        return pre_w, post, comb

    @staticmethod
    def hc_post(y, X, post, comb):
        """[P:709-712]: new X_k = post_k y + sum_j comb[j, k] X_j."""
        return post[:, :, None] * y[:, None, :] + np.einsum(
            "tjk,tjd->tkd", comb, X)

    # MoE ------------------------------------------------------------------
    def expert(self, pre, x, w=None):
        c = self.cfg
        gate = x @ self.W(pre + ".w1").T
        up = x @ self.W(pre + ".w3").T
        if c.swiglu_limit > 0:  # [P:622-632]
            up = np.clip(up, -c.swiglu_limit, c.swiglu_limit)
            gate = np.minimum(gate, c.swiglu_limit)
        h = silu(gate) * up
        if w is not None:
            h = w[:, None] * h
        return h @ self.W(pre + ".w2").T

    def moe(self, i, pre, x, tokens, k=None):
        """Gate [P:590-610] / [Q:Gate] and MoE [P:655-670]; k: the experts
        per token (the DSpark stages' own, [Q:ModelArgs.get_moe_config])."""
        c = self.cfg
        logits = x @ self.V(pre + "ffn.gate.weight").T
        if c.v41:
            logits = logits / c.gate_temp  # [Q:Gate.forward]
        if c.score_func == "softmax":
            scores = softmax(logits, -1)
        elif c.score_func == "sigmoid":
            scores = sigmoid(logits)
        else:
            scores = np.sqrt(softplus(logits))
        k = k or c.n_activated_experts
        hashed = (not c.v41) and i < c.n_hash_layers
        if hashed:
            idx = self.V(pre + "ffn.gate.tid2eid")[np.asarray(tokens)]
            if idx.shape[1] != k:
                raise ValueError("tid2eid width != num_experts_per_tok")
        else:
            idx = topk_lower_first(scores + self.V(pre + "ffn.gate.bias"), k)
        weights = np.take_along_axis(scores, idx, 1)
        if c.v41:
            if c.norm_topk_prob and k > 1:
                weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
        elif c.score_func != "softmax":
            weights = weights / weights.sum(-1, keepdims=True)
        weights = weights * c.route_scale
        y = np.zeros_like(x)
        n_exp = self.ckpt_experts(pre)
        for e in range(n_exp):
            hit = idx == e
            rows = np.nonzero(hit.any(1))[0]
            if len(rows) == 0:
                continue
            # `y[idx] += expert(...)` is a non-accumulating indexed write
            # [P:666]: a repeated expert in one row counts once (with the
            # weight of that row's first occurrence; equal values anyway).
            first = hit[rows].argmax(1)
            y[rows] += self.expert(f"{pre}ffn.experts.{e}", x[rows],
                                   weights[rows, first])
        return y + self.expert(pre + "ffn.shared_experts", x)

    def ckpt_experts(self, pre):
        return self.V(pre + "ffn.gate.weight").shape[0]

    # attention pieces -------------------------------------------------------
    def q_proj(self, pre, x):
        c = self.cfg
        qr = rms(x @ self.W(pre + "attn.wq_a").T,
                 self.V(pre + "attn.q_norm.weight"), c.norm_eps)
        q = (qr @ self.W(pre + "attn.wq_b").T).reshape(
            x.shape[0], c.n_heads, c.head_dim)
        if not c.v41:
            # [P:518]: per-head q re-normalisation (V4 only).
            q = q / np.sqrt(np.mean(q * q, -1, keepdims=True) + c.norm_eps)
        return qr, q

    def window_kv(self, pre, x):
        return rms(x @ self.W(pre + "attn.wkv").T,
                   self.V(pre + "attn.kv_norm.weight"), self.cfg.norm_eps)

    def attend(self, pre, i, q, keys, allowed, pos, freqs=None):
        """sparse_attn with the sink (MODEL_V4.md 4.3 step 6), the inverse
        RoPE and the grouped output [P:554-563]. q [T, H, D], keys [N, D],
        allowed [T, N] bool."""
        c = self.cfg
        s = np.einsum("thd,nd->thn", q, keys) / np.sqrt(c.head_dim)
        s = np.where(allowed[:, None, :], s, -np.inf)
        sink = self.V(pre + "attn.attn_sink")[None, :]
        m = np.maximum(s.max(-1), sink)
        e = np.exp(s - m[..., None])
        den = e.sum(-1) + np.exp(sink - m)
        o = np.einsum("thn,nd->thd", e, keys) / den[..., None]
        o = rope(o, pos, self.freqs[i] if freqs is None else freqs,
                 inverse=True)
        return self.out_proj(pre, o)

    def out_proj(self, pre, o):
        c = self.cfg
        T = o.shape[0]
        g = c.o_groups
        o = o.reshape(T, g, -1)
        wo_a = self.W(pre + "attn.wo_a").reshape(g, c.o_lora_rank, -1)
        z = np.einsum("tgd,grd->tgr", o, wo_a).reshape(T, -1)
        return z @ self.W(pre + "attn.wo_b").T

    # V4 compressor / indexer ------------------------------------------------
    def v4_compressor_rows(self, cpre, x, m, start=0):
        """kv and score rows (score with ape) of the tokens start..
        [P:336-346, 366]."""
        a = x @ self.W(cpre + "wkv").T
        g = x @ self.W(cpre + "wgate").T
        ape = self.V(cpre + "ape")
        T = x.shape[0]
        return a, g + ape[(start + np.arange(T)) % m]

    def v4_pool(self, a, g, m, dc):
        """Pooled (pre-norm) entries of the complete blocks [P:347-362]."""
        nb = a.shape[0] // m
        a = a[:nb * m].reshape(nb, m, a.shape[1])
        g = g[:nb * m].reshape(nb, m, g.shape[1])
        if m == 4:  # overlap_transform [P:327-334]
            ka = np.zeros((nb, 2 * m, dc))
            kg = np.full((nb, 2 * m, dc), -np.inf)
            ka[:, m:] = a[:, :, dc:]
            kg[:, m:] = g[:, :, dc:]
            ka[1:, :m] = a[:-1, :, :dc]
            kg[1:, :m] = g[:-1, :, :dc]
            a, g = ka, kg
        return (a * softmax(g, 1)).sum(1)

    def v4_finish_entries(self, cpre, pooled, first_pos, i, rotate):
        """norm, RoPE at the block's first token, Hadamard for the indexer
        [P:382-393]."""
        e = rms(pooled, self.V(cpre + "norm.weight"), self.cfg.norm_eps)
        e = rope(e, first_pos, self.freqs[i])
        if rotate:
            e = e @ hadamard(e.shape[-1]).T
        return e

    def v4_indexer_q(self, pre, i, qr, x, pos):
        c = self.cfg
        qI = (qr @ self.W(pre + "attn.indexer.wq_b").T).reshape(
            qr.shape[0], c.index_n_heads, c.index_head_dim)
        qI = rope(qI, pos, self.freqs[i])
        qI = qI @ hadamard(c.index_head_dim).T  # [P:434]
        w = (x @ self.V(pre + "attn.indexer.weights_proj.weight").T) * (
            c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5)
        return qI, w

    @staticmethod
    def index_scores(qI, w, K):
        """sum_h w_h relu(q_h . K_j) [P:440-442]: [T, N]."""
        s = np.maximum(np.einsum("thd,nd->thn", qI, K), 0.0)
        return np.einsum("thn,th->tn", s, w)

    def v4_attention(self, i, pre, x, tokens):
        c = self.cfg
        T = x.shape[0]
        pos = np.arange(T)
        m = c.compress_ratios[i]
        W = c.window_size
        qr, q = self.q_proj(pre, x)
        q = rope(q, pos, self.freqs[i])
        kv = rope(self.window_kv(pre, x), pos, self.freqs[i])
        p = pos[:, None]
        allowed = (pos[None, :] <= p) & (pos[None, :] > p - W)
        keys = kv
        if m:
            cpre = pre + "attn.compressor."
            a, g = self.v4_compressor_rows(cpre, x, m)
            nb = T // m
            ent = self.v4_finish_entries(cpre, self.v4_pool(a, g, m,
                                                            c.head_dim),
                                         np.arange(nb) * m, i, False)
            vis = np.arange(nb)[None, :] < (pos[:, None] + 1) // m
            if m == 4 and nb > 0:
                ipre = pre + "attn.indexer.compressor."
                ia, ig = self.v4_compressor_rows(ipre, x, m)
                K = self.v4_finish_entries(
                    ipre, self.v4_pool(ia, ig, m, c.index_head_dim),
                    np.arange(nb) * m, i, True)
                qI, w = self.v4_indexer_q(pre, i, qr, x, pos)
                sc = np.where(vis, self.index_scores(qI, w, K), -np.inf)
                k = min(c.index_topk, nb)  # [P:447-452]
                top = topk_lower_first(sc, k)
                sel = np.zeros((T, nb), bool)
                np.put_along_axis(sel, top, True, 1)
                vis = sel & vis
            keys = np.concatenate([kv, ent], 0)
            allowed = np.concatenate([allowed, vis], 1)
        return self.attend(pre, i, q, keys, allowed, pos)

    # V4 forward -----------------------------------------------------------
    def v4_forward(self, tokens):
        c = self.cfg
        tokens = np.asarray(tokens)
        e = self.V("embed.weight")[tokens]
        X = np.repeat(e[:, None, :], c.hc_mult, 1)  # [P:831]
        self.last_taps = []
        for i in range(c.n_layers):
            if i in c.dspark_target_layer_ids:  # 0731: the DSpark taps
                self.last_taps.append(X.mean(1))
            X = self.v4_block(i, X, tokens)
        return self.v4_head(X)

    def v4_block(self, i, X, tokens, attn_fn=None):
        c = self.cfg
        pre = f"layers.{i}."
        pw, post, comb = self.hc_mixes(X, pre, "attn")
        u = np.einsum("tj,tjd->td", pw, X)
        xa = rms(u, self.V(pre + "attn_norm.weight"), c.norm_eps)
        y = (attn_fn or self.v4_attention)(i, pre, xa, tokens)
        X = self.hc_post(y, X, post, comb)
        pw, post, comb = self.hc_mixes(X, pre, "ffn")
        u = np.einsum("tj,tjd->td", pw, X)
        xf = rms(u, self.V(pre + "ffn_norm.weight"), c.norm_eps)
        y = self.moe(i, pre, xf, tokens)
        return self.hc_post(y, X, post, comb)

    def v4_head(self, X):
        """ParallelHead.hc_head + norm + head [P:744-761]."""
        c = self.cfg
        v = self.hc_head(X, "")
        return rms(v, self.V("norm.weight"), c.norm_eps) @ self.V(
            "head.weight").T

    def hc_head(self, X, pre):
        """ParallelHead.hc_head with the `pre`hc_head_* weights: X [T, hc, d]
        collapsed to [T, d]."""
        c = self.cfg
        flat = X.reshape(X.shape[0], -1)
        r = 1.0 / np.sqrt(np.mean(flat * flat, -1, keepdims=True) + c.norm_eps)
        mixes = (flat @ self.V(pre + "hc_head_fn").T) * r
        w = sigmoid(mixes * self.V(pre + "hc_head_scale")
                    + self.V(pre + "hc_head_base")) + c.hc_eps
        return np.einsum("tj,tjd->td", w, X)

    # V4 incremental decode (the official decode-state semantics) ------------
    def v4_decode(self, tokens, split):
        """Logits of every position, computed as a prefill of tokens[:split]
        (split >= 1) followed by token-by-token decode with the official
        decode state: window ring, compressor kv_state/score_state with the
        overlap, compressed and index caches [P:336-398, 422-453, 504-540]."""
        c = self.cfg
        tokens = np.asarray(tokens)
        states = {i: {} for i in range(c.n_layers)}

        def prefill_attn(i, pre, x, toks):
            st = states[i]
            T = x.shape[0]
            st["window"] = list(rope(self.window_kv(pre, x), np.arange(T),
                                     self.freqs[i])[-c.window_size:])
            m = c.compress_ratios[i]
            if m:
                for key, cpre, dc, rot in self._v4_compressors(i, pre):
                    a, g = self.v4_compressor_rows(cpre, x, m)
                    nb = T // m
                    ent = self.v4_finish_entries(
                        cpre, self.v4_pool(a, g, m, dc), np.arange(nb) * m,
                        i, rot)
                    st[key] = CompressorState(m, dc, a, g)
                    st[key + "_cache"] = list(ent)
            return self.v4_attention(i, pre, x, toks)

        X = np.repeat(self.V("embed.weight")[tokens[:split]][:, None, :],
                      c.hc_mult, 1)
        for i in range(c.n_layers):
            X = self.v4_block(i, X, tokens[:split], prefill_attn)
        out = [self.v4_head(X)]
        for p in range(split, len(tokens)):
            def step_attn(i, pre, x, toks, p=p):
                return self._v4_decode_attn(i, pre, x, p, states[i])
            X = np.repeat(self.V("embed.weight")[tokens[p:p + 1]][:, None, :],
                          c.hc_mult, 1)
            for i in range(c.n_layers):
                X = self.v4_block(i, X, tokens[p:p + 1], step_attn)
            out.append(self.v4_head(X))
        return np.concatenate(out, 0)

    def _v4_compressors(self, i, pre):
        c = self.cfg
        m = c.compress_ratios[i]
        res = [("main", pre + "attn.compressor.", c.head_dim, False)]
        if m == 4:
            res.append(("index", pre + "attn.indexer.compressor.",
                        c.index_head_dim, True))
        return res

    def _v4_decode_attn(self, i, pre, x, p, st):
        c = self.cfg
        m = c.compress_ratios[i]
        pos = np.array([p])
        qr, q = self.q_proj(pre, x)
        q = rope(q, pos, self.freqs[i])
        kv = rope(self.window_kv(pre, x), pos, self.freqs[i])
        st["window"].append(kv[0])
        st["window"] = st["window"][-c.window_size:]  # ring of W slots
        keys = [np.stack(st["window"])]
        if m:
            for key, cpre, dc, rot in self._v4_compressors(i, pre):
                a, g = self.v4_compressor_rows(cpre, x, m, p)
                pooled = st[key].step(a[0], g[0], p)
                if pooled is not None:
                    st[key + "_cache"].append(self.v4_finish_entries(
                        cpre, pooled[None], np.array([p + 1 - m]), i,
                        rot)[0])
            n = len(st["main_cache"])
            if n != (p + 1) // m:
                raise AssertionError("compressed cache length")
            ent = np.stack(st["main_cache"]) if n else np.zeros(
                (0, c.head_dim))
            if m == 4 and n:
                K = np.stack(st["index_cache"])
                qI, w = self.v4_indexer_q(pre, i, qr, x, pos)
                top = topk_lower_first(self.index_scores(qI, w, K),
                                       min(c.index_topk, n))[0]
                ent = ent[np.sort(top)]
            keys.append(ent)
        keys = np.concatenate(keys, 0)
        return self.attend(pre, i, q, keys, np.ones((1, len(keys)), bool),
                           pos)

    # V4.1 -----------------------------------------------------------------
    def v41_forward(self, tokens):
        c = self.cfg
        tokens = np.asarray(tokens)
        T = len(tokens)
        X = np.repeat(self.V("embed.weight")[tokens][:, None, :], c.hc_mult,
                      1)
        pre_mix = np.zeros((T, c.hc_mult))
        pre_mix[:, 0] = 1.0  # make_identity_pre_mix
        shared = {}
        rows = self.engram_rows(tokens) if c.engram_layer_ids else {}
        self.last_stats = {}
        self.last_taps = []
        for i in range(c.n_layers):
            pre = f"layers.{i}."
            if i in c.engram_layer_ids:
                X = self.engram(i, X, rows[i])
            # The drafter reads the attention input of its target layers,
            # averaged over the hc copies [Q:Transformer.forward].
            if i in c.dspark_target_layer_ids:
                self.last_taps.append(X.mean(1))
            # Block.forward [Q:Block.forward]: attention collapses with the
            # previous FFN site's pre, the FFN with this attention site's.
            attn_pre, attn_post, attn_comb = self.hc_mixes(X, pre, "attn")
            u = np.einsum("tj,tjd->td", pre_mix, X)
            xa = rms(u, self.V(pre + "attn_norm.weight"), c.norm_eps)
            y = self.v41_attention(i, pre, xa, shared)
            X = self.hc_post(y, X, attn_post, attn_comb)
            ffn_pre, ffn_post, ffn_comb = self.hc_mixes(X, pre, "ffn")
            u = np.einsum("tj,tjd->td", attn_pre, X)
            xf = rms(u, self.V(pre + "ffn_norm.weight"), c.norm_eps)
            y = self.moe(i, pre, xf, tokens)
            X = self.hc_post(y, X, ffn_post, ffn_comb)
            pre_mix = ffn_pre
        v = np.einsum("tj,tjd->td", pre_mix, X)
        return rms(v, self.V("norm.weight"), c.norm_eps) @ self.V(
            "head.weight").T

    def v41_attention(self, i, pre, x, shared):
        """[Q:Attention.forward, _window_kv, _compress_kv,
        _compress_topk_idxs, Compressor, Indexer, select_candidate_blocks],
        prefill semantics (start_pos = 0)."""
        c = self.cfg
        T = x.shape[0]
        pos = np.arange(T)
        m = c.compress_ratios[i]
        W = c.window_size
        qr, q = self.q_proj(pre, x)
        q = rope(q, pos, self.freqs[i])
        kv = rope(self.window_kv(pre, x), pos, self.freqs[i])
        allowed = (pos[None, :] <= pos[:, None]) & (
            pos[None, :] > pos[:, None] - W)
        keys = kv
        if m:
            n = T // m
            lens = (pos + 1) // m
            latent = None
            if i in c.kv_source_layers:
                latent = self.v41_compress(pre + "attn.compressor.", x, m)
            if i in c.index_source_layers:
                if n == 0:
                    idx_sel = np.zeros((T, 0), bool)
                else:
                    idx_sel = self.v41_indexer(i, pre, x, qr, latent, m,
                                               shared)
                shared["topk"] = idx_sel
            else:
                idx_sel = shared["topk"]
            if latent is not None:
                shared["compress_kv"] = rope(latent, np.arange(n) * m,
                                             self.freqs[i])
            ent = shared["compress_kv"][:n]
            if idx_sel.shape != (T, n) or ent.shape[0] != n:
                raise ValueError(f"layer {i}: the shared cache does not fit")
            vis = idx_sel & (np.arange(n)[None, :] < lens[:, None])
            self.last_stats[i] = (int(vis.sum(1).max()) if n else 0,
                                  int(lens.max()) if n else 0)
            keys = np.concatenate([kv, ent], 0)
            allowed = np.concatenate([allowed, vis], 1)
        return self.attend(pre, i, q, keys, allowed, pos)

    def v41_compress(self, cpre, x, m):
        """Compressor.forward, prefill [Q:Compressor]: ratio 1 = norm(wkv(x));
        ratio > 1 = per-channel softmax over each group of m gate scores."""
        c = self.cfg
        a = x @ self.W(cpre + "wkv").T
        if m > 1:
            g = x @ self.W(cpre + "wgate").T
            n = x.shape[0] // m
            a = (a[:n * m].reshape(n, m, a.shape[1])
                 * softmax(g[:n * m].reshape(n, m, g.shape[1]), 1)).sum(1)
        return rms(a, self.V(cpre + "norm.weight"), c.norm_eps)

    def v41_indexer(self, i, pre, x, qr, latent, m, shared):
        c = self.cfg
        T = x.shape[0]
        n = T // m
        ipre = pre + "attn.indexer."
        if i in c.kv_source_layers and latent is not None:
            # index keys from the RoPE-free latent [Q:Indexer.forward]
            k = rms(latent @ self.W(ipre + "wk").T,
                    self.V(ipre + "k_norm.weight"), c.norm_eps)
            shared["index_k"] = rope(k, np.arange(latent.shape[0]) * m,
                                     self.freqs[i])
        K = shared["index_k"][:n]
        if K.shape[0] != n:
            raise ValueError(f"layer {i}: index keys do not fit")
        qI = (qr @ self.W(ipre + "wq_b").T).reshape(T, c.index_n_heads,
                                                    c.index_head_dim)
        qI = rope(qI, np.arange(T), self.freqs[i])
        w = (x @ self.V(ipre + "weights_proj.weight").T) * (
            c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5)
        sc = self.index_scores(qI, w, K)
        lens = (np.arange(T) + 1) // m
        sc = np.where(np.arange(n)[None, :] >= lens[:, None], -np.inf, sc)
        if i == c.candidate_source_layer:
            shared["candidates"] = select_candidate_blocks(
                sc, lens, c.candidate_topk_blocks, c.candidate_block_size)
        elif 0 <= c.candidate_source_layer < i:
            cand = shared["candidates"]
            if cand.shape != sc.shape:
                raise ValueError(f"layer {i}: candidates do not fit")
            sc = np.where(cand, sc, -np.inf)
        k = min(c.index_topk, n)
        top = topk_lower_first(sc, k)
        sel = np.zeros((T, n), bool)
        np.put_along_axis(sel, top, True, 1)
        return sel & (np.arange(n)[None, :] < lens[:, None])

    # Engram (V4.1) --------------------------------------------------------
    def engram_setup(self):
        if self._engram is not None:
            return self._engram
        c = self.cfg
        lookup = compressed_lookup(os.path.join(self.dir, "tokenizer.json"))
        size = len(set(lookup))
        if size != c.engram_compressed_vocab_size:
            raise ValueError(f"compressed vocabulary {size} != config "
                             f"{c.engram_compressed_vocab_size}")
        self._engram = lookup
        return lookup

    def engram_rows(self, tokens):
        """Row ids [T, columns] per Engram layer, from the independent
        reference tests/engram_store/hashing/reference_row_ids.py."""
        c = self.cfg
        lookup = self.engram_setup()
        spec = {"config": {
            "layer_ids": list(c.engram_layer_ids),
            "max_ngram_size": c.engram_max_ngram_size,
            "n_heads": c.engram_n_heads, "vocab_size": c.engram_vocab_size,
            "compressed_vocab_size": c.engram_compressed_vocab_size,
            "pad_token_id": c.engram_pad_id},
            "lookup": lookup, "sequences": [[int(t) for t in tokens]]}
        with tempfile.TemporaryDirectory() as d:
            inp = os.path.join(d, "in.json")
            meta = os.path.join(d, "meta.json")
            rows = os.path.join(d, "rows.bin")
            with open(inp, "w") as f:
                json.dump(spec, f)
            subprocess.run([sys.executable, os.path.join(
                ENGRAM_HASHING, "reference_row_ids.py"), inp, meta, rows],
                check=True)
            with open(meta) as f:
                meta_j = json.load(f)
            ids = np.fromfile(rows, dtype="<i8")
        ncol = (c.engram_max_ngram_size - 1) * c.engram_n_heads
        ids = ids.reshape(len(c.engram_layer_ids), len(tokens), ncol)
        out = {}
        for t, layer in enumerate(c.engram_layer_ids):
            want = c.engram_num_embeddings[t]
            got = meta_j["layers"][t]["num_rows"]
            if got != want:
                raise ValueError(f"engram layer {layer}: rows {got} != "
                                 f"{want}")
            out[layer] = ids[t]
        return out

    def engram_table_rows(self, layer, ids):
        """Dequantized rows [.., head_dim] (FP8 + E8M0 per 32, or NVFP4)."""
        c = self.cfg
        pre = f"layers.{layer}.engram.embed."
        wdt = self.ckpt.dtype(pre + "weight")
        w = np.asarray(self.ckpt.raw(pre + "weight"))
        s = np.asarray(self.ckpt.raw(pre + "scale"))
        rw, rs = w[ids.reshape(-1)], s[ids.reshape(-1)]
        if wdt == "F8_E4M3":
            blk = rw.shape[-1] // rs.shape[-1]
            v = st_format.E4M3[rw] * np.repeat(st_format.E8M0[rs], blk, -1)
        elif wdt == "U8":
            vals = st_format.unpack_fp4(rw)
            blk = vals.shape[-1] // rs.shape[-1]
            g = getattr(c, "engram_quant_global_scale", {}) or {}
            gs = float(g.get(str(layer), 1.0))
            v = vals * np.repeat(st_format.E4M3[rs], blk, -1) * gs
        else:
            raise ValueError(f"engram table dtype {wdt}")
        return v.reshape(ids.shape + (v.shape[-1],))

    def engram(self, layer, X, ids):
        """[Q:Engram.forward]: gated value into every hc copy."""
        c = self.cfg
        pre = f"layers.{layer}.engram."
        e = self.engram_table_rows(layer, ids).reshape(ids.shape[0], -1)
        kv = e @ self.W(pre + "wkv").T
        hc, d = c.hc_mult, c.dim
        key = kv[:, :hc * d].reshape(-1, hc, d)
        value = kv[:, hc * d:]
        weight = self.V(pre + "q_weight") * self.V(pre + "k_weight")
        rstd = 1.0 / np.sqrt(np.mean(X * X, -1) + c.norm_eps) / np.sqrt(
            np.mean(key * key, -1) + c.norm_eps)
        dot = (X * weight[None] * key).sum(-1) * rstd * d ** -0.5
        gate = sigmoid(np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)),
                                   dot))
        return X + gate[..., None] * value[:, None, :]

    # common -----------------------------------------------------------------
    def logits(self, tokens):
        if not all(0 <= int(t) < self.cfg.vocab_size for t in tokens):
            raise ValueError("token id out of range")
        if self.cfg.v41:
            return self.v41_forward(tokens)
        return self.v4_forward(tokens)


    # DSpark ----------------------------------------------------------------
    def dspark_draft(self, tokens):
        """The target's greedy token after `tokens` (the anchor) and the
        drafter's greedy proposals [Q:Transformer.forward_spec, DSparkBlock,
        DSparkAttention, get_dspark_topk_idxs, DSparkMarkovHead,
        DSparkConfidenceHead]: every prompt position is committed, so each
        stage's window ring holds main_kv of the last window_size positions
        and the block [anchor, noise...] sits at positions T .. T + bs - 1.
        Returns (anchor, drafts, confidence logits, draft logits)."""
        c = self.cfg
        if not c.dspark_block_size:
            raise ValueError("no DSpark stages")
        tokens = np.asarray(tokens)
        T = len(tokens)
        logits = (self.v41_forward if c.v41 else self.v4_forward)(tokens)
        anchor = int(np.argmax(logits[-1]))
        if len(self.last_taps) != len(c.dspark_target_layer_ids):
            raise ValueError("a DSpark target layer is not a main layer")
        # Concatenated in layer order, as main_hiddens is built.
        taps = np.concatenate(self.last_taps, -1)
        main_x = rms(taps @ self.W("mtp.0.main_proj").T,
                     self.V("mtp.0.main_norm.weight"), c.norm_eps)
        bs = c.dspark_block_size
        W = c.window_size
        ring = np.arange(max(0, T - W), T)
        block = T + np.arange(bs)
        # DSpark layers are window-only: rope_theta without YaRN.
        freqs = rope_freqs(c.rope_head_dim, c.rope_theta, False, c)
        ids = np.array([anchor] + [c.dspark_noise_token_id] * (bs - 1))
        X = np.repeat(self.V("embed.weight")[ids][:, None, :], c.hc_mult, 1)
        pre_mix = np.zeros((bs, c.hc_mult))
        pre_mix[:, 0] = 1.0
        k = c.dspark_n_activated_experts or c.n_activated_experts
        # The stages are counted from compress_ratios (the 0731 release
        # writes num_nextn_predict_layers 1 next to three DSpark stages).
        stages = len(c.compress_ratios) - c.n_layers
        for s in range(stages):
            pre = f"mtp.{s}."
            attn_pre, attn_post, attn_comb = self.hc_mixes(X, pre, "attn")
            # V4.1 blocks collapse with the previous sub-layer's mix; V4
            # (0731) blocks with their own (Block.forward of each).
            u = np.einsum("tj,tjd->td", pre_mix if c.v41 else attn_pre, X)
            xa = rms(u, self.V(pre + "attn_norm.weight"), c.norm_eps)
            main_kv = rope(self.window_kv(pre, main_x[ring]), ring, freqs)
            _, q = self.q_proj(pre, xa)
            q = rope(q, block, freqs)
            kv = rope(self.window_kv(pre, xa), block, freqs)
            keys = np.concatenate([main_kv, kv], 0)
            y = self.attend(pre, None, q, keys,
                            np.ones((bs, len(keys)), bool), block, freqs)
            X = self.hc_post(y, X, attn_post, attn_comb)
            ffn_pre, ffn_post, ffn_comb = self.hc_mixes(X, pre, "ffn")
            u = np.einsum("tj,tjd->td", attn_pre if c.v41 else ffn_pre, X)
            xf = rms(u, self.V(pre + "ffn_norm.weight"), c.norm_eps)
            # Stage layer ids follow the main layers (never hash-routed).
            y = self.moe(c.n_layers + s, pre, xf, ids, k)
            X = self.hc_post(y, X, ffn_post, ffn_comb)
            pre_mix = ffn_pre
        last = f"mtp.{stages - 1}."
        # forward_head: V4.1 collapses with the last FFN mix, V4 (0731) with
        # the last stage's hc_head.
        x = (np.einsum("tj,tjd->td", pre_mix, X) if c.v41
             else self.hc_head(X, last))
        dl = rms(x, self.V(last + "norm.weight"), c.norm_eps) @ self.V(
            "head.weight").T
        mh = last + "markov_head."
        w1 = "markov_w1" if self.ckpt.has(mh + "markov_w1.weight") else "embed"
        w2 = "markov_w2" if w1 == "markov_w1" else "head"
        m_embed = self.V(f"{mh}{w1}.weight")
        m_head = self.V(f"{mh}{w2}.weight")
        proj = self.V(last + "confidence_head.proj.weight")[0]
        prev, drafts, conf = anchor, [], []
        for i in range(bs):
            e = m_embed[prev]
            dl[i] = dl[i] + m_head @ e
            prev = int(np.argmax(dl[i]))
            drafts.append(prev)
            conf.append(float(proj @ np.concatenate([x[i], e])))
        return anchor, drafts, conf, dl


class CompressorState:
    """Compressor.kv_state / score_state after a prefill of the rows a, g
    (score with ape), and their decode update [P:336-375]."""

    def __init__(self, m, dc, a, g):
        self.m, self.dc = m, dc
        self.overlap = m == 4
        coff = 2 if self.overlap else 1
        self.kv = np.zeros((coff * m, coff * dc))
        self.sc = np.full((coff * m, coff * dc), -np.inf)
        T = a.shape[0]
        rem = T % m
        cutoff = T - rem
        off = m if self.overlap else 0
        if self.overlap and cutoff >= m:
            self.kv[:m] = a[cutoff - m:cutoff]
            self.sc[:m] = g[cutoff - m:cutoff]
        if rem:
            self.kv[off:off + rem] = a[cutoff:]
            self.sc[off:off + rem] = g[cutoff:]

    def step(self, a, g, p):
        m, d = self.m, self.dc
        done = (p + 1) % m == 0
        if self.overlap:
            self.kv[m + p % m] = a
            self.sc[m + p % m] = g
            if not done:
                return None
            kv = np.concatenate([self.kv[:m, :d], self.kv[m:, d:]], 0)
            sc = np.concatenate([self.sc[:m, :d], self.sc[m:, d:]], 0)
            out = (kv * softmax(sc, 0)).sum(0)
            self.kv[:m] = self.kv[m:]
            self.sc[:m] = self.sc[m:]
            return out
        self.kv[p % m] = a
        self.sc[p % m] = g
        if not done:
            return None
        return (self.kv * softmax(self.sc, 0)).sum(0)


def select_candidate_blocks(scores, lens, topk_blocks, block):
    """[Q:select_candidate_blocks]: blocks scored by their best entry, the
    block of the newest visible entry pinned to +inf, the top topk_blocks
    kept unless they came back -inf; a bool mask like `scores`."""
    T, width = scores.shape
    pad = -width % block
    s = np.concatenate([scores, np.full((T, pad), -np.inf)], 1)
    s = s.reshape(T, -1, block).max(-1)
    nb = s.shape[1]
    last = (lens - 1) // block
    s = np.where(np.arange(nb)[None, :] == last[:, None], np.inf, s)
    top = topk_lower_first(s, min(topk_blocks, nb))
    keep = np.zeros((T, nb), bool)
    vals = np.take_along_axis(s, top, 1)
    np.put_along_axis(keep, top, vals > -np.inf, 1)
    return np.repeat(keep, block, 1)[:, :width]


# ---------------------------------------------------------------------------
# Compressed vocabulary for the Engram hashing (ENGRAM.md, [Q:engram.py
# build_compressed_token_map]) from a byte-level BPE tokenizer.json.


def _byte_decoder():
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
    return {chr(c): b for b, c in zip(bs, cs)}


def compressed_lookup(tokenizer_path):
    sys.path.insert(0, ENGRAM_HASHING)
    from normalizer_reference import normalize  # noqa: E402
    with open(tokenizer_path) as f:
        tok = json.load(f)
    vocab = dict(tok["model"]["vocab"])
    added = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
    id_to_token = {v: k for k, v in vocab.items()}
    id_to_token.update(added)
    n = max(id_to_token) + 1
    dec = _byte_decoder()
    keys = {}
    lookup = []
    for tid in range(n):
        raw = id_to_token.get(tid)
        if raw is None:
            raise ValueError(f"tokenizer has no token {tid}")
        if tid in added:
            text = raw
        else:
            text = bytes(dec[ch] for ch in raw).decode("utf-8", "replace")
        if "\ufffd" in text:
            key = raw
        else:
            norm = normalize(text)
            key = norm if norm else text
        lookup.append(keys.setdefault(key, len(keys)))
    return lookup


# ---------------------------------------------------------------------------


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def run(checkpoint, tokens, greedy=0, logits_positions=()):
    model = Model(checkpoint)
    logits, gaps = logits_with_gaps(model, tokens)
    lp = log_softmax(logits)
    prompt_lp = [None] + [float(lp[p - 1, tokens[p]])
                          for p in range(1, len(tokens))]
    out = {"model_type": model.cfg.model_type, "tokens": list(tokens),
           "prompt_logprobs": prompt_lp,
           "last_argmax": int(np.argmax(logits[-1])),
           # Query positions whose top-k selections have a near tie.
           "selection_gaps": [float(g) for g in gaps]}
    seq = list(tokens)
    gen = []
    gen_gaps = []
    last, last_gaps = logits, gaps
    for _ in range(greedy):
        nxt = int(np.argmax(last[-1]))
        gen.append(nxt)
        gen_gaps.append(float(last_gaps[-1]))
        seq.append(nxt)
        if len(gen) < greedy:
            last, last_gaps = logits_with_gaps(model, seq)
    out["greedy"] = gen
    out["greedy_selection_gaps"] = gen_gaps
    out["logits"] = {str(p): [float(v) for v in logits[p]]
                     for p in logits_positions}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--logits-positions", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    if not tokens:
        ap.error("--tokens is empty")
    if not 0 <= a.greedy <= 4096:
        ap.error("--greedy out of range")
    pos = [int(p) for p in a.logits_positions.split(",") if p.strip()]
    for p in pos:
        if not 0 <= p < len(tokens):
            ap.error(f"--logits-positions: {p} out of range")
    out = run(a.checkpoint, tokens, a.greedy, pos)
    with open(a.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
