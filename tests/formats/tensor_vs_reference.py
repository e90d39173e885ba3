"""`mneme tensor` on the tiny EXL3 and GridBook checkpoints of
`mneme make-checkpoint --experts-format exl3|gridbook` against the numpy
references of the producers' code (exl3_reference.py, gridbook_reference.py):
the loader's placement (stacked experts, row halves, Transformers-spelled
targets, legacy tensor forms) and the decode together.

EXL3 weights match to fp32 rounding (the reference is float64); GridBook
weights bit for bit (the decode contract rounds to bf16).

Usage: tensor_vs_reference.py --mneme PATH
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "exl3"))
sys.path.insert(0, os.path.join(HERE, "gridbook"))
sys.path.insert(0, os.path.join(HERE, "..", "model", "reference"))
import exl3_reference as exl3  # noqa: E402
import gridbook_reference as gb  # noqa: E402
import st_format  # noqa: E402


def mneme_tensor(mneme, ckpt, name, out_dir):
    npy = os.path.join(out_dir, name.replace(".", "_") + ".npy")
    result = subprocess.run(
        [mneme, "tensor", "--checkpoint", ckpt, "--name", name, "--npy", npy,
         "--threads", "1", "--json"],
        check=True, capture_output=True, text=True)
    info = json.loads(result.stdout)
    return info, np.load(npy)


def check_exl3(mneme, work):
    ckpt_dir = os.path.join(work, "exl3")
    subprocess.run([mneme, "make-checkpoint", "--model", "--arch", "v4-flash",
                    "--experts-format", "exl3", "--out", ckpt_dir, "--seed",
                    "3"], check=True, capture_output=True)
    ckpt = st_format.Checkpoint(ckpt_dir)
    names = [f"layers.{layer}.ffn.experts.{e}.w{w}"
             for layer in (0, 3) for e in (0, 1, 2, 3) for w in (1, 2, 3)]
    names += ["layers.1.ffn.shared_experts.w1", "layers.1.ffn.shared_experts.w2"]
    cbs = set()
    for name in names:
        info, got = mneme_tensor(mneme, ckpt_dir, name, work)
        assert info["format"] == "exl3", info
        present = [n for n in ("mcg", "mul1") if ckpt.has(f"{name}.{n}")]
        cb = exl3.select_codebook(present)
        cbs.add(cb)
        trellis = ckpt.raw(f"{name}.trellis")
        suh = ckpt.raw(f"{name}.suh").view(np.float16)
        svh = ckpt.raw(f"{name}.svh").view(np.float16)
        want = exl3.dequantize(np.asarray(trellis), suh, svh, cb).T  # [n, k]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        err = np.max(np.abs(got.astype(np.float64) - want))
        scale = np.max(np.abs(want))
        assert err <= 1e-5 * scale, (name, err, scale)
    assert cbs == {"3inst", "mcg", "mul1"}, cbs
    print(f"exl3: {len(names)} modules match the reference "
          f"(codebooks {sorted(cbs)})")


def check_gridbook(mneme, work):
    ckpt_dir = os.path.join(work, "gridbook")
    subprocess.run([mneme, "make-checkpoint", "--model", "--arch", "v4-flash",
                    "--experts-format", "gridbook", "--out", ckpt_dir,
                    "--seed", "5"], check=True, capture_output=True)
    ckpt = st_format.Checkpoint(ckpt_dir)
    with open(os.path.join(ckpt_dir, "quant_config.json")) as f:
        quant = json.load(f)
    sidecar = st_format.SafetensorsFile(
        os.path.join(ckpt_dir, "cb_codebooks.pqcb"))
    groups = quant["config_groups"]

    def scheme_of(group):
        s = groups[group]["scheme"]
        coding = "none"
        if s["grid"] == "fp4":
            coding = "v2" if s.get("scale_coding") else "v1"
        table = s.get("scale_coding", {}).get("table") \
            if isinstance(s.get("scale_coding"), dict) else None
        scheme = gb.make_scheme(groups[group]["format"], coding, table)
        tables = [np.asarray(sidecar.raw(r)).view(np.float16)
                  for r in s["codebook_ref"]]
        return scheme, tables

    checked = 0
    routed, routed_tables = scheme_of("group_routed_experts")
    for layer in (0, 4):
        for e in (0, 5, 15):
            for w in (1, 2, 3):
                name = f"layers.{layer}.ffn.experts.{e}.w{w}"
                info, got = mneme_tensor(mneme, ckpt_dir, name, work)
                assert info["format"] == "gridbook", info
                proj = "down_proj" if w == 2 else "gate_up_proj"
                q = np.asarray(ckpt.raw(
                    f"layers.{layer}.ffn.experts.{proj}.cb_qweight"))[e]
                if w != 2:
                    half = q.shape[0] // 2
                    q = q[:half] if w == 1 else q[half:]
                bits = gb.decode_weight_bf16(q, routed_tables, routed)
                want = gb.bf16_to_f32(bits)
                assert got.shape == want.shape, (name, got.shape)
                assert np.array_equal(got, want), name
                checked += 1
    shared, shared_tables = scheme_of("group_shared_experts")
    for layer in (0, 2):
        for w in (1, 2, 3):
            name = f"layers.{layer}.ffn.shared_experts.w{w}"
            info, got = mneme_tensor(mneme, ckpt_dir, name, work)
            assert info["format"] == "gridbook", info
            q = np.asarray(ckpt.raw(f"{name}.cb_qweight"))
            ws = np.asarray(ckpt.raw(f"{name}.weight_scale"))
            want = gb.bf16_to_f32(
                gb.decode_weight_bf16(q, shared_tables, shared, ws))
            assert np.array_equal(got, want), name
            checked += 1
    # A name that is no linear weight: a clear error, no file.
    bad = subprocess.run(
        [mneme, "tensor", "--checkpoint", ckpt_dir, "--name",
         "layers.0.ffn.experts.99.w1", "--npy",
         os.path.join(work, "bad.npy")], capture_output=True, text=True)
    assert bad.returncode != 0, bad
    assert "no linear weight" in bad.stderr or "expert 99" in bad.stderr, \
        bad.stderr
    assert not os.path.exists(os.path.join(work, "bad.npy"))
    # A passthrough unit stays FP8.
    info, _ = mneme_tensor(mneme, ckpt_dir, "layers.0.attn.wq_a", work)
    assert info["format"] == "fp8 block", info
    print(f"gridbook: {checked} modules match the reference bit for bit")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mneme", required=True)
    args = parser.parse_args()
    mneme = os.path.abspath(args.mneme)
    work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    check_exl3(mneme, work)
    check_gridbook(mneme, work)
    print("OK")


if __name__ == "__main__":
    main()
