"""Write EXL3 decode test vectors (safetensors) from the numpy reference.

Usage:
    make_exl3_vectors.py --out FILE [--seed N]
    make_exl3_vectors.py --self-test

Contents (all little-endian):
- lut.{3inst,mcg,mul1}            I16 [65536]  fp16 bits of each state's value
- exl3.{cb}.K{K}, K = 1..8 (k, n = 256, 128 for even K; 128, 384 for odd K):
    .trellis I16 [k/16, n/16, 16K]  uniformly random bits
    .suh F16 [k], .svh F16 [n]      random sign * uniform(0.5, 2) * 0.01
    .what I16 [k, n]                fp16 bits of Ŵ (row = input feature)
    .weight F32 [k, n]              float64 W rounded to float32
    .x F32 [3, k]                   standard normal
    .y F32 [3, n]                   x @ W in float64 (x as stored), rounded
- legacy.su I16 [16], legacy.sv I16 [8] random packed signs, and
  legacy.su_values F32 [256], legacy.sv_values F32 [128] their ±1 values
- states.K{K} I16 [4, 256]        states of tiles trellis[0, 0..3] of exl3.mcg.K{K}
- __metadata__ {"format": "exl3-vectors", "seed": "<N>"}
See exl3_reference.py for the definitions and their exllamav3 sources.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exl3_reference as ref  # noqa: E402

_DTYPES = {
    # 16-bit words (fp16 bits, states) travel as I16: the readers of the
    # checkpoint formats have no U16.
    np.dtype("<u2"): "I16",
    np.dtype("<i2"): "I16",
    np.dtype("<f2"): "F16",
    np.dtype("<f4"): "F32",
}


def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer: u64 LE header size, JSON header padded with
    spaces to a multiple of 8, then the tensors' bytes back to back in order."""
    header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        arr = arr.astype(dt, copy=False)
        if arr.dtype not in _DTYPES:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
        data = arr.tobytes()
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for data in blobs:
            f.write(data)


def read_safetensors(path):
    """Read back a file written by write_safetensors: (tensors, metadata)."""
    inv = {v: k for k, v in _DTYPES.items()}
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(raw[base + b:base + e], dtype=inv[info["dtype"]]).reshape(info["shape"])
    return out, meta


def _scales(rng, size):
    """Random sign * uniform(0.5, 2) * 0.01, as fp16 (RNE)."""
    sign = rng.choice(np.array([-1.0, 1.0]), size)
    return (sign * rng.uniform(0.5, 2.0, size) * 0.01).astype(np.float16)


def make_vectors(seed):
    """Ordered dict name -> array of all the test vectors."""
    rng = np.random.default_rng(seed)
    out = {}
    luts = {cb: ref.lut(cb) for cb in ref.CODEBOOKS}
    for cb in ref.CODEBOOKS:
        out[f"lut.{cb}"] = luts[cb]

    for cb in ref.CODEBOOKS:
        for K in range(1, 9):
            k, n = (256, 128) if K % 2 == 0 else (128, 384)
            trellis = rng.integers(0, 65536, (k // 16, n // 16, 16 * K), dtype=np.uint16).view(np.int16)
            suh = _scales(rng, k)
            svh = _scales(rng, n)
            what = ref.decode_what(trellis, cb)
            w = ref.dequantize(trellis, suh, svh, cb)
            x = rng.standard_normal((3, k)).astype(np.float32)
            y = x.astype(np.float64) @ w
            p = f"exl3.{cb}.K{K}"
            out[f"{p}.trellis"] = trellis
            out[f"{p}.suh"] = suh
            out[f"{p}.svh"] = svh
            out[f"{p}.what"] = what
            out[f"{p}.weight"] = w.astype(np.float32)
            out[f"{p}.x"] = x
            out[f"{p}.y"] = y.astype(np.float32)

    su = rng.integers(0, 65536, 16, dtype=np.uint16).view(np.int16)
    sv = rng.integers(0, 65536, 8, dtype=np.uint16).view(np.int16)
    out["legacy.su"] = su
    out["legacy.sv"] = sv
    out["legacy.su_values"] = ref.unpack_signs(su).astype(np.float32)
    out["legacy.sv_values"] = ref.unpack_signs(sv).astype(np.float32)

    for K in range(1, 9):
        tr = out[f"exl3.mcg.K{K}.trellis"]
        out[f"states.K{K}"] = ref.unpack_states(tr[0, 0:4], K)
    return out


def self_test():
    """Reference self-check plus a write/read round trip of a small file."""
    import tempfile
    ref.self_check()
    tensors = {"a": np.arange(5, dtype=np.uint16), "b": np.array([[1.5, -2]], dtype=np.float32),
               "c": np.array([-1, 2, 3], dtype=np.int16), "d": np.array([0.25], dtype=np.float16)}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.safetensors")
        write_safetensors(path, tensors, {"format": "x", "seed": "3"})
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
        assert hlen % 8 == 0
        back, meta = read_safetensors(path)
    assert meta == {"format": "x", "seed": "3"}
    assert list(back) == list(tensors)
    for name, arr in tensors.items():
        got = back[name].view(arr.dtype)  # uint16 comes back as int16 bits
        assert np.array_equal(got, arr), name
    # The generated vectors are self-consistent.
    v = make_vectors(7)
    assert np.array_equal(v["states.K3"], ref.unpack_states(v["exl3.mcg.K3.trellis"][0, :4], 3))
    w64 = ref.dequantize(v["exl3.mul1.K2.trellis"], v["exl3.mul1.K2.suh"], v["exl3.mul1.K2.svh"], "mul1")
    assert np.array_equal(v["exl3.mul1.K2.weight"], w64.astype(np.float32))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output .safetensors path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--self-test", action="store_true", help="run the self checks and exit 0/1")
    args = ap.parse_args(argv)
    if args.self_test:
        try:
            self_test()
        except AssertionError as e:
            print(f"exl3 self-test FAILED: {e!r}", file=sys.stderr)
            return 1
        print("exl3 self-test OK")
        return 0
    if not args.out:
        ap.error("--out is required")
    tensors = make_vectors(args.seed)
    write_safetensors(args.out, tensors, {"format": "exl3-vectors", "seed": str(args.seed)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
