#!/usr/bin/env python3
"""Compares `mneme draft` with the float64 reference of the DSpark drafter
(deepseek_reference.Model.dspark_draft) on a tiny V4.1 or V4-Flash-0731
checkpoint: for
prompts shorter and longer than the window, the anchor and every greedy
draft identical and the confidence logits within a tolerance.

Usage:
  compare_draft.py --mneme PATH/TO/mneme [--arch v4.1-flash|v4-flash-0731]
      [--lengths 3,9,40] [--seed S]
      [--tolerance 2e-3] [--mneme-arg=--chunk-tokens=7 ...]

Exits 0 when everything agrees, 1 when not, 2 on a usage or run error.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# A draft whose top-2 draft logits are closer than this (relative) is a
# near tie fp32 cannot decide the way float64 does: the drafts from there on
# are not compared (and this is reported).
AMBIGUOUS_GAP = 1e-5


def run_draft(binary, checkpoint, tokens, extra):
    cmd = [binary, "draft", "--checkpoint", checkpoint, "--tokens",
           ",".join(map(str, tokens)), "--json"] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"mneme draft failed ({p.returncode}):\n"
                           f"{p.stderr[-4000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


def gap(row):
    top = np.sort(row)[-2:]
    return (top[1] - top[0]) / max(abs(top[1]), 1e-30)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mneme", required=True)
    ap.add_argument("--arch", default="v4.1-flash",
                    choices=["v4.1-flash", "v4-flash-0731"])
    ap.add_argument("--lengths", default="3,9,40")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=2e-3)
    ap.add_argument("--mneme-arg", action="append", default=[])
    a = ap.parse_args(argv)
    binary = os.path.abspath(a.mneme)
    import deepseek_reference
    ok = True
    try:
        base = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        checkpoint = os.path.join(base, a.arch)
        p = subprocess.run([binary, "make-checkpoint", "--model", "--arch",
                            a.arch, "--out", checkpoint],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("mneme make-checkpoint failed:\n"
                               + p.stderr[-4000:])
        model = deepseek_reference.Model(checkpoint)
        V = model.cfg.vocab_size
        rng = np.random.default_rng(a.seed)
        for n in [int(x) for x in a.lengths.split(",") if x.strip()]:
            tokens = [int(t) for t in rng.integers(3, min(V, 320), n)]
            anchor, drafts, conf, dl = model.dspark_draft(tokens)
            got = run_draft(binary, checkpoint, tokens, a.mneme_arg)
            lines = [f"prompt of {n} tokens: reference anchor {anchor} "
                     f"drafts {drafts}"]
            if got.get("anchor") != anchor:
                ok = False
                lines.append(f"  anchor DIFFERS: mneme {got.get('anchor')}")
            else:
                cut = next((i for i in range(len(drafts))
                            if gap(dl[i]) < AMBIGUOUS_GAP), len(drafts))
                mine = list(got.get("draft_token_ids") or [])
                if cut < len(drafts):
                    lines.append(f"  draft {cut} is a near tie: the {cut} "
                                 "drafts before it are compared")
                if mine[:cut] != drafts[:cut] or len(mine) != len(drafts):
                    ok = False
                    lines.append(f"  drafts DIFFER: mneme {mine}")
                c = got.get("confidence") or []
                if len(c) != len(conf):
                    ok = False
                    lines.append(f"  confidence: {len(c)} values, want "
                                 f"{len(conf)}")
                else:
                    for i in range(cut):
                        if abs(c[i] - conf[i]) > a.tolerance * max(
                                1.0, abs(conf[i])):
                            ok = False
                            lines.append(f"  confidence {i} DIFFERS: mneme "
                                         f"{c[i]:.6f} reference "
                                         f"{conf[i]:.6f}")
            print("\n".join(lines))
    except (RuntimeError, ValueError, OSError) as e:
        print(f"ERROR: {e}")
        return 2
    print("RESULT: " + ("AGREE" if ok else "DISAGREE"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
