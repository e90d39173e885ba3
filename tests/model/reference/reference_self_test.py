"""Self-checks of the float64 DeepSeek-V4 / V4.1 reference
(deepseek_reference.py) on tiny random checkpoints in the real layouts:
number formats, V4 prefill == token-by-token decode with the official decode
state, causality, the indexers really dropping entries, expert permutation
invariance, the Hadamard cancelling, Engram rows reaching the right
positions, the candidate blocks, and the CLI's output."""

import json
import os
import re
import struct
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "testing"))

import deepseek_reference as R  # noqa: E402
import st_format as sf  # noqa: E402
import tiny_checkpoint  # noqa: E402

TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
_DIRS = {}


def checkpoint(arch):
    if arch not in _DIRS:
        d = os.path.join(TMP, "ckpt_" + arch)
        if not os.path.exists(os.path.join(d, "config.json")):
            tiny_checkpoint.write_tiny(d, arch, seed=7)
        _DIRS[arch] = d
    return _DIRS[arch]


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 320, n)


class FormatTest(unittest.TestCase):

    def test_e4m3_e8m0_bf16(self):
        self.assertEqual(sf.E4M3[0x7E], 448.0)
        self.assertEqual(sf.E4M3[0x08], 2.0 ** -6)
        self.assertEqual(sf.E4M3[0x01], 2.0 ** -9)
        self.assertEqual(sf.E4M3[0xB8], -1.0)
        self.assertTrue(np.isnan(sf.E4M3[0x7F]) and np.isnan(sf.E4M3[0xFF]))
        self.assertEqual(sf.E8M0[127], 1.0)
        self.assertEqual(sf.E8M0[130], 8.0)
        self.assertTrue(np.isnan(sf.E8M0[255]))
        self.assertEqual(sf.decode("BF16", np.array([0x3FC0], np.uint16))[0],
                         1.5)
        x = np.array([1.0, -2.75, 3e-3])
        y = sf.decode("BF16", sf.bf16_bits(x))
        self.assertEqual(y[0], 1.0)
        self.assertEqual(y[1], -2.75)
        self.assertLess(abs(y[2] - 3e-3), 3e-3 / 128)

    def test_mxfp4_nibble_order_and_scale(self):
        # byte 0x2B: low nibble 0xB = -1.5 (element 0), high 0x2 = 1.0.
        w = np.array([[0x2B] * 16], np.uint8).view(np.int8)
        s = np.array([[129]], np.uint8)  # 2^2
        v = sf.dequant_mxfp4(w, s)
        self.assertEqual(v.shape, (1, 32))
        self.assertEqual(v[0, 0], -6.0)
        self.assertEqual(v[0, 1], 4.0)

    def test_fp8_block_scales(self):
        w = np.full((3, 5), 0x38, np.uint8)  # 1.0
        s = np.array([[127, 128, 129], [130, 131, 132]], np.uint8)
        v = sf.dequant_fp8(w, s, (2, 2))
        self.assertEqual(v[0, 0], 1.0)
        self.assertEqual(v[1, 3], 2.0)
        self.assertEqual(v[2, 4], 32.0)
        with self.assertRaises(ValueError):
            sf.dequant_fp8(w, s[:, :2], (2, 2))

    def test_safetensors_round_trip_and_bad_header(self):
        d = tempfile.mkdtemp(dir=TMP)
        p = os.path.join(d, "a.safetensors")
        sf.write_safetensors(p, [("x", "I64", np.arange(6).reshape(2, 3)),
                                 ("y", "F32", np.ones(4))])
        f = sf.SafetensorsFile(p)
        self.assertEqual(f.raw("x").tolist(), [[0, 1, 2], [3, 4, 5]])
        self.assertEqual(f.shape("y"), (4,))
        with open(p, "r+b") as h:
            h.write(struct.pack("<Q", 1 << 40))
        with self.assertRaises(ValueError):
            sf.SafetensorsFile(p)

    def test_config_names(self):
        hf = dict(tiny_checkpoint.V4_CONFIG, vocab_size=320)
        a = R.Config(hf)
        inf = {"dim": 256, "n_layers": 5, "n_heads": 8, "head_dim": 128,
               "rope_head_dim": 64, "q_lora_rank": 128, "o_lora_rank": 128,
               "o_groups": 2, "window_size": 16,
               "compress_ratios": [0, 0, 4, 128, 4, 0], "vocab_size": 320,
               "n_routed_experts": 16, "n_activated_experts": 6,
               "norm_eps": 1e-6, "rope_theta": 10000,
               "compress_rope_theta": 160000, "original_seq_len": 65536,
               "rope_factor": 16, "n_hash_layers": 3}
        b = R.Config(inf)
        for k in inf:
            self.assertEqual(getattr(a, k), getattr(b, k), k)
        self.assertFalse(b.v41)
        self.assertEqual(a.block, (128, 128))
        v41 = R.Config({"model_type": "deepseek_v41",
                        "text_config": dict(tiny_checkpoint.V41_TEXT,
                                            vocab_size=320)})
        self.assertTrue(v41.v41)
        self.assertEqual(v41.kv_source_layers, [2, 4, 6])
        self.assertEqual(v41.candidate_source_layer, 6)
        self.assertEqual(v41.norm_eps, 1e-20)
        self.assertEqual(v41.block, (32, 32))


class V4Test(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = R.Model(checkpoint("v4-flash"))

    def test_healthy_logits(self):
        lg = self.model.logits(tokens(64, 1))
        self.assertGreater(lg.std(), 0.8)
        self.assertLess(lg.std(), 6.0)

    def test_prefill_equals_decode(self):
        t = tokens(200, 2)
        full = self.model.logits(t)
        for split in (1, 3, 4, 15, 16, 17, 63, 127, 128, 131):
            d = self.model.v4_decode(t, split)
            self.assertLess(np.abs(d - full).max(), 1e-9, split)
        t = tokens(300, 3)
        full = self.model.logits(t)
        for split in (255, 256, 257):
            d = self.model.v4_decode(t, split)
            self.assertLess(np.abs(d - full).max(), 1e-9, split)

    def test_causality(self):
        t = tokens(150, 4)
        a = self.model.logits(t)
        t2 = t.copy()
        t2[100] = (t2[100] + 1) % 320
        b = self.model.logits(t2)
        self.assertLess(np.abs(a[:100] - b[:100]).max(), 1e-12)
        self.assertGreater(np.abs(a[100:] - b[100:]).max(), 1e-3)

    def test_indexer_drops_entries(self):
        t = tokens(300, 5)
        a = self.model.logits(t)
        cfg = self.model.cfg
        old = cfg.index_topk
        try:
            cfg.index_topk = 10 ** 6
            b = self.model.logits(t)
        finally:
            cfg.index_topk = old
        # 16 entries at ratio 4 are visible up to position 66: there the
        # top-k keeps everything; later it must drop entries.
        self.assertLess(np.abs(a[:67] - b[:67]).max(), 1e-12)
        self.assertGreater(np.abs(a[67:] - b[67:]).max(), 1e-3)

    def test_hadamard_cancels(self):
        t = tokens(120, 6)
        a = self.model.logits(t)
        orig = R.hadamard
        try:
            R.hadamard = lambda n: np.eye(n)
            b = self.model.logits(t)
        finally:
            R.hadamard = orig
        self.assertLess(np.abs(a - b).max(), 1e-9)

    def test_expert_permutation(self):
        check_permutation(self, self.model)

    def test_cli(self):
        out = os.path.join(TMP, "cli_v4.json")
        t = [int(x) for x in tokens(40, 8)]
        R.main(["--checkpoint", checkpoint("v4-flash"), "--tokens",
                ",".join(map(str, t)), "--greedy", "3",
                "--logits-positions", "0,39", "--out", out])
        with open(out) as f:
            j = json.load(f)
        self.assertEqual(j["model_type"], "deepseek_v4")
        self.assertIsNone(j["prompt_logprobs"][0])
        self.assertEqual(len(j["prompt_logprobs"]), 40)
        self.assertEqual(j["greedy"][0], j["last_argmax"])
        self.assertEqual(len(j["greedy"]), 3)
        lg = self.model.logits(t + j["greedy"][:2])
        self.assertEqual(int(np.argmax(lg[-1])), j["greedy"][2])
        l39 = np.array(j["logits"]["39"])
        self.assertEqual(int(np.argmax(l39)), j["last_argmax"])
        l0 = R.log_softmax(np.array(j["logits"]["0"]))
        self.assertAlmostEqual(l0[t[1]], j["prompt_logprobs"][1], places=12)
        with self.assertRaises(SystemExit):
            R.main(["--checkpoint", checkpoint("v4-flash"), "--tokens", "1",
                    "--logits-positions", "3", "--out", out])


class V41Test(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.model = R.Model(checkpoint("v4.1-flash"))

    def test_healthy_logits(self):
        lg = self.model.logits(tokens(64, 11))
        self.assertGreater(lg.std(), 0.8)
        self.assertLess(lg.std(), 6.0)

    def test_causality(self):
        t = tokens(160, 12)
        a = self.model.logits(t)
        t2 = t.copy()
        t2[90] = (t2[90] + 7) % 320
        b = self.model.logits(t2)
        self.assertLess(np.abs(a[:90] - b[:90]).max(), 1e-12)
        self.assertGreater(np.abs(a[90:] - b[90:]).max(), 1e-3)

    def test_indexers_drop_entries(self):
        t = tokens(300, 13)
        a = self.model.logits(t)
        stats = dict(self.model.last_stats)
        for layer in (2, 3, 4, 5, 6, 7, 8):
            kept, visible = stats[layer]
            self.assertEqual(kept, 16, layer)
            self.assertGreater(visible, kept, layer)
        cfg = self.model.cfg
        old = cfg.index_topk
        try:
            cfg.index_topk = 10 ** 6
            b = self.model.logits(t)
        finally:
            cfg.index_topk = old
        # Up to position 15 every compressed entry (ratio 1 and 2) fits in
        # 16 and in the 8 candidate blocks of 4.
        self.assertLess(np.abs(a[:16] - b[:16]).max(), 1e-12)
        self.assertGreater(np.abs(a[16:] - b[16:]).max(), 1e-3)

    def test_candidates_matter(self):
        t = tokens(300, 14)
        a = self.model.logits(t)
        cfg = self.model.cfg
        old = cfg.candidate_source_layer
        try:
            cfg.candidate_source_layer = -1
            b = self.model.logits(t)
        finally:
            cfg.candidate_source_layer = old
        # Layer 8 only differs once more than 8 blocks of 4 are visible.
        self.assertLess(np.abs(a[:32] - b[:32]).max(), 1e-12)
        self.assertGreater(np.abs(a[32:] - b[32:]).max(), 1e-6)

    def test_select_candidate_blocks(self):
        s = np.array([[5.0, 1.0, 0.0, 9.0, 2.0, 3.0, 7.0, -np.inf, -np.inf]])
        lens = np.array([7])
        keep = R.select_candidate_blocks(s, lens, 2, 2)
        # blocks: [5,1]=5, [0,9]=9, [2,3]=3, [7,-inf]=7 (newest, pinned),
        # [-inf]: top 2 = pinned block 3 and block 1.
        self.assertEqual(keep[0].tolist(), [False, False, True, True, False,
                                            False, True, True, False])
        keep = R.select_candidate_blocks(s[:, :2], np.array([0]), 4, 2)
        self.assertEqual(keep.tolist(), [[True, True]])
        keep = R.select_candidate_blocks(np.full((1, 4), -np.inf),
                                         np.array([0]), 4, 2)
        self.assertEqual(keep.tolist(), [[False] * 4])

    def test_engram_rows_reach_their_position(self):
        t = tokens(60, 15)
        rows = self.model.engram_rows(t)
        cfg = self.model.cfg
        for t_i, layer in enumerate(cfg.engram_layer_ids):
            r = rows[layer]
            self.assertEqual(r.shape, (60, 24))
            self.assertTrue((r >= 0).all())
            self.assertTrue((r < cfg.engram_num_embeddings[t_i]).all())
        a = self.model.logits(t)
        target = int(rows[3][40, 5])
        only_here = not (rows[3][:40] == target).any()
        orig = self.model.engram_table_rows

        def patched(layer, ids):
            v = orig(layer, ids)
            if layer == 3:
                v = v + 0.5 * (ids == target)[..., None]
            return v
        self.model.engram_table_rows = patched
        try:
            b = self.model.logits(t)
        finally:
            del self.model.engram_table_rows
        if only_here:
            self.assertLess(np.abs(a[:40] - b[:40]).max(), 1e-12)
        self.assertGreater(np.abs(a[40] - b[40]).max(), 1e-6)

    def test_expert_permutation(self):
        check_permutation(self, self.model)

    def test_nvfp4_tables_equal_fp8(self):
        # The same table values stored as NVFP4 (E2M1 + E4M3 per 16 +
        # global scale) give the same logits as the FP8 tables.
        d = os.path.join(TMP, "ckpt_v41_nvfp4")
        if not os.path.exists(os.path.join(d, "config.json")):
            tiny_checkpoint.write_tiny(d, "v4.1-flash", seed=7,
                                       engram_format="nvfp4")
        nv = R.Model(d)
        self.assertEqual(nv.ckpt.dtype("layers.1.engram.embed.weight"), "U8")
        t = tokens(50, 16)
        self.assertLess(np.abs(nv.logits(t) - self.model.logits(t)).max(),
                        1e-12)
        # a wrong global scale is noticed
        nv.cfg.engram_quant_global_scale = {"1": 1.0, "3": 0.5}
        self.assertGreater(np.abs(nv.logits(t) - self.model.logits(t)).max(),
                           1e-6)


class CompareDriverTest(unittest.TestCase):
    """compare_with_mneme.py against a stand-in binary that prints a given
    `mneme run --json` output."""

    def run_driver(self, doctor):
        import compare_with_mneme
        ckpt = checkpoint("v4-flash")
        t = [int(x) for x in tokens(30, 31)]
        ref = R.run(ckpt, t, 4)
        got = {"token_ids": list(ref["greedy"]), "finish_reason": "length",
               "logprobs": [], "prompt_tokens": len(t), "seconds": 0.1,
               "prompt_logprobs": list(ref["prompt_logprobs"])}
        doctor(got)
        d = tempfile.mkdtemp(dir=TMP)
        out = os.path.join(d, "out.json")
        with open(out, "w") as f:
            json.dump(got, f)
        fake = os.path.join(d, "mneme")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\ncat '%s'\n" % out)
        os.chmod(fake, 0o755)
        return compare_with_mneme.main(
            ["--mneme", fake, "--checkpoint", ckpt, "--tokens",
             ",".join(map(str, t)), "--max-new-tokens", "4"])

    def test_agree(self):
        def small(j):
            j["prompt_logprobs"][5] += 1e-3
        self.assertEqual(self.run_driver(small), 0)

    def test_logprob_off(self):
        def off(j):
            j["prompt_logprobs"][7] += 3e-3
        self.assertEqual(self.run_driver(off), 1)

    def test_greedy_differs(self):
        def other(j):
            j["token_ids"][2] = (j["token_ids"][2] + 1) % 320
        self.assertEqual(self.run_driver(other), 1)

    def test_objects_instead_of_numbers(self):
        def objects(j):
            j["prompt_logprobs"] = [{"logprob": x}
                                    for x in j["prompt_logprobs"]]
        self.assertEqual(self.run_driver(objects), 1)

    def test_missing_position(self):
        def drop(j):
            j["prompt_logprobs"].pop()
        self.assertEqual(self.run_driver(drop), 1)


def check_permutation(test, model):
    """Renumbering the routed experts (gate rows, biases, expert tensors,
    tid2eid) leaves the logits unchanged."""
    E = model.cfg.n_routed_experts
    perm = np.random.default_rng(3).permutation(E)
    inv = np.argsort(perm)
    pat = re.compile(r"^(layers\.\d+\.ffn\.experts\.)(\d+)(\..*)$")

    class Permuted(R.Model):
        def V(self, name):
            v = super().V(name)
            if name.startswith("layers.") and (
                    name.endswith("ffn.gate.weight")
                    or name.endswith("ffn.gate.bias")):
                return v[perm]
            if name.endswith("ffn.gate.tid2eid"):
                return inv[v]
            return v

        def W(self, prefix):
            m = pat.match(prefix)
            if m:
                prefix = m.group(1) + str(perm[int(m.group(2))]) + m.group(3)
            return super().W(prefix)

    p = Permuted(model.dir)
    t = tokens(90, 21)
    a = model.logits(t)
    b = p.logits(t)
    test.assertLess(np.abs(a - b).max(), 1e-9)
    # and a wrong renumbering is noticed
    Permuted.V = lambda self, name: (R.Model.V(self, name)[perm]
                                     if name.endswith("ffn.gate.bias")
                                     else R.Model.V(self, name))
    c = Permuted(model.dir).logits(t)
    test.assertGreater(np.abs(a - c).max(), 1e-6)


if __name__ == "__main__":
    from junit_runner import main
    main()
