#!/usr/bin/env python3
"""Compares `mneme run` with the float64 reference (deepseek_reference.py) on
one checkpoint: every prompt logprob within a tolerance (default 2e-3) and
the greedy continuation identical.

Usage:
  compare_with_mneme.py --mneme PATH/TO/mneme
      (--checkpoint DIR | --make-checkpoint v4-flash|v4.1-flash
       [--numpy-checkpoint])
      [--tokens 1,2,3 | --random-tokens N [--seed S]]
      [--max-new-tokens N] [--tolerance 2e-3] [--threads N]
      [--mneme-arg=--chunk-tokens=7 ...]

--make-checkpoint writes a tiny checkpoint with `mneme make-checkpoint
--model --arch ARCH --out DIR` (or, with --numpy-checkpoint, with this
folder's tiny_checkpoint.py) under $TEST_TMPDIR or a temporary folder.
It runs `mneme run --checkpoint DIR --tokens ... --prompt-logprobs --json
--max-new-tokens N --temperature 0 --ignore-eos` and the reference with
--greedy N, prints a report and exits 0 when everything agrees, 1 when not,
2 on a usage or run error.
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


def run_mneme(binary, checkpoint, tokens, new_tokens, threads, extra=()):
    cmd = [binary, "run", "--checkpoint", checkpoint, "--tokens",
           ",".join(map(str, tokens)), "--prompt-logprobs", "--json",
           "--max-new-tokens", str(new_tokens), "--temperature", "0",
           "--ignore-eos"]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed "
                           f"({p.returncode}):\n{p.stderr[-4000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError("mneme run printed nothing")
    return json.loads(lines[-1])


def vocab_size(checkpoint):
    with open(os.path.join(checkpoint, "config.json")) as f:
        c = json.load(f)
    return int((c.get("text_config") or c).get("vocab_size",
                                                 c.get("vocab_size")))


# A relative gap between the k-th and (k+1)-th score of a top-k below this
# is a near tie that fp32 arithmetic cannot resolve the way float64 does:
# the logits of that query position are not compared (and are reported).
AMBIGUOUS_GAP = 1e-5


def compare(mneme_json, ref, tokens, tolerance):
    """Returns (ok, report lines)."""
    lines = []
    ok = True
    gaps = ref.get("selection_gaps") or [float("inf")] * len(tokens)
    # prompt_logprobs[p] comes from the logits of query position p - 1.
    ambiguous = {p for p in range(1, len(tokens))
                 if gaps[p - 1] < AMBIGUOUS_GAP}
    plp = mneme_json.get("prompt_logprobs")
    if not isinstance(plp, list) or len(plp) != len(tokens):
        return False, [f"prompt_logprobs: expected {len(tokens)} entries, "
                       f"got {None if plp is None else len(plp)}"]
    worst = (0.0, -1)
    bad = []
    for p, entry in enumerate(plp):
        if entry is not None and not isinstance(entry, (int, float)):
            return False, [f"prompt_logprobs[{p}]: expected a number or "
                           f"null, got {entry!r}"]
        want = ref["prompt_logprobs"][p]
        got = entry
        if p == 0:
            if got is not None:
                ok = False
                lines.append(f"position 0: logprob {got}, expected null")
            continue
        if got is None:
            ok = False
            bad.append((p, None, want))
            continue
        err = abs(got - want)
        if p in ambiguous:
            continue
        if err > worst[0]:
            worst = (err, p)
        if not err <= tolerance:
            ok = False
            bad.append((p, got, want))
    diffs = [abs(e - w) for p, (e, w) in
             enumerate(zip(plp[1:], ref["prompt_logprobs"][1:]), 1)
             if e is not None and p not in ambiguous]
    if ambiguous:
        lines.append(
            f"{len(ambiguous)} position(s) not compared: a top-k selection "
            f"there has a near tie (relative gap < {AMBIGUOUS_GAP:g}): "
            + ", ".join(f"{p} (gap {gaps[p - 1]:.2g})"
                        for p in sorted(ambiguous)))
    lines.append(f"prompt logprobs: {len(tokens) - 1 - len(ambiguous)} "
                 f"compared, max |diff| "
                 f"{worst[0]:.3g} at position {worst[1]}, mean "
                 f"{(np.mean(diffs) if diffs else 0):.3g}, "
                 f"{len(bad)} over {tolerance:g}")
    for p, got, want in bad[:20]:
        lines.append(f"  position {p} (token {tokens[p]}): mneme {got} "
                     f"reference {want:.6f}")
    if len(bad) > 20:
        lines.append(f"  ... {len(bad) - 20} more")
    gen = list(mneme_json.get("token_ids") or [])
    want = list(ref["greedy"])
    # Compare the steps before the first one decided at a near tie.
    gen_gaps = ref.get("greedy_selection_gaps") or []
    cut = next((i for i, g in enumerate(gen_gaps) if g < AMBIGUOUS_GAP), None)
    if cut is not None:
        lines.append(f"greedy step {cut} is decided at a near tie: the "
                     f"{cut} steps before it are compared")
        gen, want = gen[:cut], want[:cut]
    if gen == want:
        lines.append(f"greedy continuation: {len(gen)} tokens identical "
                     f"{gen}")
    else:
        ok = False
        first = next((i for i, (a, b) in enumerate(zip(gen, want)) if a != b),
                     min(len(gen), len(want)))
        lines.append(f"greedy continuation DIFFERS at step {first}: "
                     f"mneme {gen} reference {want}")
    return ok, lines


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="compare mneme run with the float64 reference")
    ap.add_argument("--mneme", required=True, help="the mneme binary")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint")
    src.add_argument("--make-checkpoint", choices=["v4-flash", "v4.1-flash"])
    ap.add_argument("--numpy-checkpoint", action="store_true")
    ap.add_argument("--tokens")
    ap.add_argument("--random-tokens", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--tolerance", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--mneme-arg", action="append", default=[],
                    help="extra argument for mneme run (repeatable), e.g. "
                    "--mneme-arg=--chunk-tokens=7")
    a = ap.parse_args(argv)
    if not 0 <= a.max_new_tokens <= 256:
        ap.error("--max-new-tokens out of range")
    binary = os.path.abspath(a.mneme)
    checkpoint = a.checkpoint
    try:
        if a.make_checkpoint:
            base = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
            checkpoint = os.path.join(base, a.make_checkpoint)
            if a.numpy_checkpoint:
                import tiny_checkpoint
                tiny_checkpoint.write_tiny(checkpoint, a.make_checkpoint)
            else:
                p = subprocess.run([binary, "make-checkpoint", "--model",
                                    "--arch", a.make_checkpoint, "--out",
                                    checkpoint], capture_output=True,
                                   text=True)
                if p.returncode != 0:
                    raise RuntimeError("mneme make-checkpoint failed:\n"
                                       + p.stderr[-4000:])
        V = vocab_size(checkpoint)
        if a.tokens:
            tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
        else:
            n = a.random_tokens or 200
            # ids 3.. avoid the special tokens of the synthetic tokenizers
            tokens = [int(t) for t in np.random.default_rng(a.seed).integers(
                3, min(V, 320), n)]
        if not tokens or not all(0 <= t < V for t in tokens):
            ap.error("tokens empty or out of range")
        import deepseek_reference
        ref = deepseek_reference.run(checkpoint, tokens, a.max_new_tokens)
        got = run_mneme(binary, checkpoint, tokens, a.max_new_tokens,
                        a.threads, a.mneme_arg)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"ERROR: {e}")
        return 2
    ok, lines = compare(got, ref, tokens, a.tolerance)
    print(f"checkpoint {checkpoint} ({ref['model_type']}), "
          f"{len(tokens)} prompt tokens, {a.max_new_tokens} greedy tokens")
    for ln in lines:
        print(ln)
    print("RESULT: " + ("AGREE" if ok else "DISAGREE"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
