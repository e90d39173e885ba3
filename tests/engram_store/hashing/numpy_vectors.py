"""Test vectors from numpy itself for the C++ reproduction of numpy.random.

Usage: numpy_vectors.py OUT.json

Writes SeedSequence pools and states, PCG64 states and raw outputs, and
Generator.integers(low, high, size) draws (dtype int64) together with the bit
generator state after the draws, for many seeds and ranges. 64-bit and 128-bit
numbers are written as JSON integers (128-bit ones as [high, low] halves).
"""

import json
import sys

import numpy as np

MASK64 = (1 << 64) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


def words32(n):
    """numpy's coercion of a non-negative int to uint32 words (LSW first)."""
    if n == 0:
        return [0]
    out = []
    while n > 0:
        out.append(n & 0xFFFFFFFF)
        n >>= 32
    return out


def halves(n):
    return [(n >> 64) & MASK64, n & MASK64]


def pcg_state(bit_generator):
    st = bit_generator.state
    return {
        "state": halves(st["state"]["state"]),
        "inc": halves(st["state"]["inc"]),
        "has_uint32": int(st["has_uint32"]),
        "uinteger": int(st["uinteger"]),
    }


ENTROPIES = [
    0, 1, 2, 7, 42, 10007, 10007 * 14, 10007 * 61, 123456789, 2**31 - 1,
    2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**64 - 1,
    # More words than the pool holds (4): the extra-entropy mixing path.
    2**128 + 12345, 2**160 - 1, 3**200,
]

SEEDS = [0, 1, 5, 10007, 140098, 2**32 + 3, 2**64 - 1]

RANGES = [
    (0, 1),                      # rng == 0: no draw
    (0, 2), (0, 3), (-5, 5), (0, 1000), (17, 99092),
    (0, 2**31 + 1),              # 32-bit path, ~50% rejections
    (0, 2**32 - 1), (0, 2**32),  # rng == 0xFFFFFFFF: plain next_uint32
    (0, 2**32 + 1),              # smallest 64-bit range
    (-2**40, 2**40), (0, (I64_MAX // 99092) // 2),
    (I64_MIN, 1),                # 64-bit path, ~50% rejections
    (I64_MIN, I64_MAX), (0, I64_MAX), (-1, 0),
]

SIZES = [1, 4, 9]

# Several calls on one generator: the buffered 32-bit half must carry over
# between calls and survive 64-bit draws in between.
SEQUENCES = [
    [(0, 10, 3), (0, 2**40, 2), (0, 10, 1), (0, 7, 2)],
    [(0, 2**32, 1), (5, 6, 3), (0, 2**32, 2), (0, 2**31 + 1, 5)],
    [(0, 100, 1), (0, 100, 1), (0, 100, 1), (I64_MIN, 1, 3), (0, 100, 1)],
]


def main():
    out = {"seed_sequences": [], "pcg64": [], "integers": [], "sequences": []}
    for entropy in ENTROPIES:
        ss = np.random.SeedSequence(entropy)
        out["seed_sequences"].append({
            "entropy_words": words32(entropy),
            "pool": [int(x) for x in ss.pool],
            "state32": [int(x) for x in ss.generate_state(9, np.uint32)],
            "state64": [int(x) for x in ss.generate_state(5, np.uint64)],
        })
        bg = np.random.PCG64(ss)
        seeded = pcg_state(bg)
        raw = [int(x) for x in bg.random_raw(12)]
        out["pcg64"].append({
            "entropy_words": words32(entropy),
            "seeded": seeded,
            "raw": raw,
        })
    for seed in SEEDS:
        for low, high in RANGES:
            for size in SIZES:
                rng = np.random.default_rng(seed)
                values = rng.integers(low, high, size=size, dtype=np.int64)
                out["integers"].append({
                    "seed": seed, "low": low, "high": high, "size": size,
                    "values": [int(v) for v in values],
                    "after": pcg_state(rng.bit_generator),
                })
    for seed in SEEDS[:4]:
        for calls in SEQUENCES:
            rng = np.random.default_rng(seed)
            results = []
            for low, high, size in calls:
                values = rng.integers(low, high, size=size, dtype=np.int64)
                results.append({"low": low, "high": high, "size": size,
                                "values": [int(v) for v in values]})
            out["sequences"].append({
                "seed": seed, "calls": results,
                "after": pcg_state(rng.bit_generator),
            })
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
