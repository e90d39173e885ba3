"""Independent reference for Engram row ids, written from the model's
definition (ENGRAM.md "Row id computation"; the public Engram demo's
NgramHashMapping) with real numpy.

Usage: reference_row_ids.py IN.json OUT_META.json OUT_ROWS.bin

IN.json:  {"config": {"layer_ids": [...], "max_ngram_size": N,
                      "n_heads": H, "vocab_size": V,
                      "compressed_vocab_size": C, "pad_token_id": P},
           "lookup": [compressed id of token 0, 1, ...],
           "sequences": [[token ids], ...]}
OUT_META.json: per layer its multipliers, primes, offsets and rows.
OUT_ROWS.bin: int64 little-endian row ids, for each layer (config order),
              for each sequence, for each position, for each column.
Every sequence is hashed as a whole sequence starting at its first token.
"""

import json
import sys

import numpy as np


def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def find_next_prime(start, seen):
    candidate = start + 1
    while True:
        if is_prime(candidate) and candidate not in seen:
            return candidate
        candidate += 1


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    cfg = spec["config"]
    lookup = np.asarray(spec["lookup"], dtype=np.int64)
    # The compressed vocabulary's size is its number of distinct ids.
    compressed_size = len(set(spec["lookup"]))
    assert compressed_size == cfg["compressed_vocab_size"], compressed_size
    layer_ids = cfg["layer_ids"]
    max_n = cfg["max_ngram_size"]
    heads = cfg["n_heads"]
    pad = int(lookup[cfg["pad_token_id"]])

    max_long = np.iinfo(np.int64).max
    half_bound = max(1, int(max_long // compressed_size) // 2)
    multipliers = {}
    for layer_id in layer_ids:
        g = np.random.default_rng(int(10007 * layer_id))
        r = g.integers(low=0, high=half_bound, size=(max_n,), dtype=np.int64)
        multipliers[layer_id] = r * 2 + 1

    seen = set()
    primes = {}
    for layer_id in layer_ids:
        layer_primes = []
        for _ in range(2, max_n + 1):
            start = cfg["vocab_size"] - 1
            for _ in range(heads):
                p = find_next_prime(start, seen)
                seen.add(p)
                layer_primes.append(p)
                start = p
        primes[layer_id] = layer_primes

    meta = {"layers": []}
    offsets = {}
    for layer_id in layer_ids:
        offs = [0]
        for p in primes[layer_id][:-1]:
            offs.append(offs[-1] + p)
        offsets[layer_id] = offs
        meta["layers"].append({
            "layer_id": layer_id,
            "multipliers": [int(m) for m in multipliers[layer_id]],
            "primes": primes[layer_id],
            "offsets": offs,
            "num_rows": sum(primes[layer_id]),
        })

    chunks = []
    with np.errstate(over="ignore"):
        for layer_id in layer_ids:
            mult = multipliers[layer_id]
            for seq in spec["sequences"]:
                x = lookup[np.asarray(seq, dtype=np.int64)][None, :]
                t_len = x.shape[1]

                def shift(k):
                    if k == 0:
                        return x
                    return np.pad(x, ((0, 0), (k, 0)), mode="constant",
                                  constant_values=pad)[:, :t_len]

                shifts = [shift(k) for k in range(max_n)]
                columns = []
                for n in range(2, max_n + 1):
                    mix = shifts[0] * mult[0]
                    for k in range(1, n):
                        mix = np.bitwise_xor(mix, shifts[k] * mult[k])
                    for j in range(heads):
                        c = (n - 2) * heads + j
                        # numpy's % on int64 is Python's: non-negative here.
                        columns.append(mix % primes[layer_id][c] +
                                       offsets[layer_id][c])
                rows = np.stack(columns, axis=2)[0]  # [T, columns]
                chunks.append(rows.astype("<i8").tobytes())

    with open(sys.argv[2], "w") as f:
        json.dump(meta, f)
    with open(sys.argv[3], "wb") as f:
        for chunk in chunks:
            f.write(chunk)


if __name__ == "__main__":
    main()
